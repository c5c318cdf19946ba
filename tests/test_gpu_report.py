"""bench/gpu_report.py without a GPU: it records the environment, says what it could not run, and exits 0."""

import json

import torch
from click.testing import CliRunner

from bench import gpu_report


def test_report_without_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(torch.version, 'cuda', None)  # as the CPU build of torch: nothing to build
    result = CliRunner().invoke(gpu_report.main, ['--outdir', str(tmp_path / 'report')])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / 'report' / 'report.json').read_text())
    steps = ['build', 'self_check', 'choices', 'gpu_tests', 'bench_ops', 'train_speed', 'train_speed_stylegan']
    assert all(report[step] is None for step in steps) and report['environment']['gpus'] == []
    text = (tmp_path / 'report' / 'report.md').read_text()
    for _, title, _ in gpu_report.TRAINING_RUNS:  # every section is there, saying why it did not run
        assert f'### {title}\n\nnot run: no GPU' in text
    assert '### Kernel or reference (the chooser, first use of each shape)\n\nNot run: no GPU.' in text


def test_markdown_flags_failed_checks_and_lists_choices():
    report = dict(quick=False, environment=gpu_report.environment(), build={}, gpu_tests=None, bench_ops=None,
                  train_speed=None, train_speed_stylegan=None,
                  self_check=[dict(op='upfirdn2d', dtype='float16', error=float('nan'), tolerance=0.02,
                                   where='exception', ms=3.0, ok=False, cause='RuntimeError: no kernel image')],
                  choices=[dict(op='filter2d [1,2,1]', shape='[16, 512, 8, 8]', dtype='float32', kernel_ms=0.25,
                                reference_ms=0.125, chosen='reference')])
    lines = gpu_report.markdown(report).splitlines()
    assert any('RuntimeError: no kernel image' in line and 'False' in line for line in lines)
    assert any(line.startswith('| filter2d [1,2,1]') and '0.125' in line and 'reference' in line for line in lines)
