"""bench/gpu_report.py: without a GPU it records the environment, says what it could not run, and exits 0; its
test-suite and digits steps, run here on the CPU."""

import json
import os
import tarfile

import torch
from click.testing import CliRunner

from bench import gpu_report


def test_report_without_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(torch.version, 'cuda', None)  # as the CPU build of torch: nothing to build
    result = CliRunner().invoke(gpu_report.main, ['--outdir', str(tmp_path / 'report')])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / 'report' / 'report.json').read_text())
    steps = ['build', 'self_check', 'choices', 'test_suite', 'bench_ops', 'digits'] + [key for key, *_ in gpu_report.TRAINING_RUNS]
    assert all(report[step] is None for step in steps) and report['environment']['gpus'] == []
    text = (tmp_path / 'report' / 'report.md').read_text()
    for _, title, _, _ in gpu_report.TRAINING_RUNS:  # every section is there, saying why it did not run
        assert f'### {title}\n\nnot run: no GPU' in text
    assert '### Kernel or reference (the chooser, first use of each shape)\n\nNot run: no GPU.' in text
    assert sorted(os.listdir(tmp_path / 'report')) == ['report.json', 'report.md']


def test_markdown_flags_failed_checks_and_lists_choices():
    report = dict(quick=False, seconds=1.0, environment=gpu_report.environment(), build={}, test_suite=None,
                  bench_ops=None, digits=None, **{key: None for key, *_ in gpu_report.TRAINING_RUNS},
                  self_check=[dict(op='upfirdn2d', dtype='float16', error=float('nan'), tolerance=0.02,
                                   where='exception', ms=3.0, ok=False, cause='RuntimeError: no kernel image')],
                  choices=[dict(op='filter2d [1,2,1]', shape='[16, 512, 8, 8]', dtype='float32', kernel_ms=0.25,
                                reference_ms=0.125, chosen='reference')])
    lines = gpu_report.markdown(report).splitlines()
    assert any('RuntimeError: no kernel image' in line and 'False' in line for line in lines)
    assert any(line.startswith('| filter2d [1,2,1]') and '0.125' in line and 'reference' in line for line in lines)


def test_suite_results_name_each_failure(tmp_path, monkeypatch):
    """pytest-xdist's JUnit XML (one testsuite per run, under testsuites) is counted and each failure named."""
    xml = """<testsuites><testsuite tests="5" failures="1" errors="1" skipped="1">
      <testcase classname="tests.test_a" name="test_ok"/>
      <testcase classname="tests.test_a" name="test_bad"><failure message="assert 1 == 2"/></testcase>
      <testcase classname="tests.test_b" name="test_broken"><error message="fixture failed"/></testcase>
      <testcase classname="tests.test_b" name="test_gpu"><skipped/></testcase>
      <testcase classname="tests.test_b" name="test_ok2"/></testsuite></testsuites>"""

    def fake_run(command, log_path, timeout):
        xml_arg = next(a for a in command if a.startswith('--junitxml='))
        with open(xml_arg.split('=', 1)[1], 'w') as f:
            f.write(xml)
        return dict(command=' '.join(command), returncode=1, seconds=2.0, log='tests.log')
    monkeypatch.setattr(gpu_report, '_run', fake_run)
    result = gpu_report.run_test_suite(str(tmp_path), timeout=60)
    assert (result['passed'], result['failures'], result['errors'], result['skipped']) == (2, 1, 1, 1)
    assert result['failed'] == [dict(test='tests.test_a::test_bad', message='assert 1 == 2'),
                                dict(test='tests.test_b::test_broken', message='fixture failed')]


def test_digits_run_is_stopped_by_its_time_box_and_scored(tmp_path, monkeypatch):
    """A run far longer than its time box is stopped; its last (whole) snapshot is scored and its grid kept; every
    log goes into one archive."""
    monkeypatch.setattr(gpu_report, 'DIGITS_COMMAND', [
        'train.py', '--cfg=gn-stylegan', '--data=data/digits32.zip', '--cmax=4', '--batch=4', '--lod-kimg=0.02',
        '--kimg=100', '--xflip=0', '--tick=0.02', '--snap=1', '--workers=0'])
    workdir, outdir = tmp_path / 'work', tmp_path / 'out'
    workdir.mkdir()
    outdir.mkdir()
    result = gpu_report.digits_run(str(workdir), str(outdir), seconds=40, timeout=300, device='cpu',
                                   score_args=('--num=20', '--epochs=1'))
    assert result['returncode'] == 'stopped after the time box'
    assert result['snapshot'].startswith('network-snapshot-') and os.path.isfile(outdir / 'digits-fakes.png')
    rows = result['score']['data']['rows']
    assert result['score']['returncode'] == 0 and rows[1]['name'].endswith(result['snapshot']) and rows[1]['num'] == 20
    gpu_report._archive_logs(str(workdir), str(outdir))
    with tarfile.open(outdir / 'logs.tar.gz') as tar:
        assert sorted(tar.getnames()) == ['digits-quality.log', 'digits-train.log']
