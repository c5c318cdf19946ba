"""bench/gpu_report.py on a CPU: without a GPU it records the environment, says why each other step did not run and
exits 0; the budget and the time boxes; a run stopped by SIGTERM or SIGINT in the middle of a step, or by a step
that raises, leaves a valid report of the steps that finished; the test-suite and digits steps, run here."""

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
import types

import psutil
import pytest
import torch
from click.testing import CliRunner

from bench import gpu_report
from ops import bias_act
from tests.support.host_plugin import HostPlugin, UpsamplingOnePercentOff
from torch_utils import kernel_choice

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _report(outdir):
    """report.json, and report.md's lines, after checking that the Markdown is the JSON's rendering."""
    data = json.loads((outdir / 'report.json').read_text())
    text = (outdir / 'report.md').read_text()
    assert text == gpu_report.markdown(data)
    return {entry['key']: entry for entry in data['steps']}, data, text


def test_report_without_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(torch.version, 'cuda', None)  # as the CPU build of torch: nothing to build
    monkeypatch.setattr(gpu_report, 'process_start', time.monotonic)  # This test's start, not pytest's.
    (tmp_path / 'report').mkdir()
    for name in ('logs.tar.gz', 'digits-fakes.png', 'notes.txt'):  # An earlier run's outputs, and a file of the user's.
        (tmp_path / 'report' / name).write_text('earlier')
    result = CliRunner().invoke(gpu_report.main, ['--quick', '--outdir', str(tmp_path / 'report')])
    assert result.exit_code == 0, result.output
    steps, data, text = _report(tmp_path / 'report')
    assert list(steps) == [step.key for step in gpu_report.STEPS if step.seconds[True] is not None]
    assert steps['environment']['status'] == 'ok' and steps['environment']['result']['gpus'] == []
    assert steps['build']['why'] == f'this torch ({torch.__version__}) has no CUDA support'
    for key, entry in steps.items():  # every section is there, saying why it did not run
        if key not in ('environment', 'build'):
            assert (entry['status'], entry['why'], entry['result']) == ('not run', 'no GPU', None)
            assert f'### {entry["title"]}\n\nNot run: no GPU.' in text
    assert data['budget_s'] == 360 and data['stopped'] is None
    assert sorted(os.listdir(tmp_path / 'report')) == ['notes.txt', 'report.json', 'report.md']


def test_the_plan_is_the_docstrings_table_and_quick_fits_360_seconds():
    """The docstring's table is the plan, step by step; --quick's plans add up to its default budget of 360 s, and the
    full run plans every step that --quick runs but its two test steps, in whose place it runs the whole suite."""
    doc = gpu_report.__doc__
    table = doc[doc.index('  step            planned s'):doc.index('  total')]
    plans = [tuple(None if plan == '-' else int(plan) for plan in row)
             for row in re.findall(r'^  .{15}\s*(\d+|-) /\s+(\d+|-)    ', table, re.MULTILINE)]
    assert plans == [(step.seconds[True], step.seconds[False]) for step in gpu_report.STEPS]
    quick, full = gpu_report.planned_steps(True), gpu_report.planned_steps(False)
    assert sum(step.seconds[True] for step in quick) == 360
    assert {s.key for s in quick} - {s.key for s in full} == {'first_tests', 'test_sample'}
    assert {s.key for s in full} - {s.key for s in quick} >= {'test_suite'}
    assert f'  total           360 / {sum(step.seconds[False] for step in full):4d}\n' in doc


def _suite(files):
    """A collected suite: `files` maps a file name to (tests, how many of them are marked gpu, the first ones)."""
    return [dict(id=f'tests/{name}::test_{i}', gpu=i < gpu) for name, (count, gpu) in files.items() for i in range(count)]


def test_quick_plan_runs_the_gpu_tests_first_and_samples_the_rest_within_its_plan():
    """--quick's tests: first (right after the build) every test marked gpu and every test of the graph-check files,
    then, after the self-check and the chooser, a sample of the others as large as the sample step's plan holds on
    16 workers by the cost model, drawn from every file before any file twice, the same at every run."""
    keys = [step.key for step in gpu_report.planned_steps(True)]
    assert keys[:4] == ['environment', 'build', 'first_tests', 'self_check'] and keys[5] == 'test_sample'
    plan_s = gpu_report.planned_steps(True)[5].seconds[True]
    files = {'test_graphs.py': (30, 3), 'test_training_step.py': (20, 0), 'test_ops_gpu.py': (40, 40),
             'test_loss.py': (120, 2), 'test_misc.py': (900, 0), 'test_one.py': (1, 0), 'test_two.py': (2, 0)}
    files.update({f'test_f{i}.py': (10 + 7 * i, 1 if i % 3 == 0 else 0) for i in range(40)})
    tests = _suite(files)
    plan = gpu_report.quick_test_plan(tests, workers=16, sample_seconds=plan_s)
    first_files = {'test_graphs.py', 'test_training_step.py', 'test_ops_gpu.py'}
    expected_first = [t['id'] for t in tests if t['gpu'] or t['id'].split('::')[0][6:] in first_files]
    assert plan['first'] == expected_first and len(expected_first) == 30 + 20 + 40 + 2 + 14
    rest = [t['id'] for t in tests if t['id'] not in set(expected_first)]
    assert plan['rest'] == len(rest) and set(plan['sample']) <= set(rest)
    assert plan['sample'] == [i for i in rest if i in set(plan['sample'])]  # In the suite's order.
    # (50 s - 15 s of start) * 16 workers / (232 * 16 / 1769 worker-seconds a test) = 266.9: 266 tests.
    assert len(plan['sample']) == 266 == (plan_s - 15) * 1769 // 232
    assert gpu_report.planned_test_seconds(266, 16) <= plan_s < gpu_report.planned_test_seconds(267, 16)
    drawn = {name: sum(i.startswith(f'tests/{name}::') for i in plan['sample']) for name in files}
    left = {name: sum(i.startswith(f'tests/{name}::') for i in rest) for name in files}
    depth = max(drawn.values())
    assert all(drawn[name] in (min(left[name], depth - 1), min(left[name], depth)) for name in files if left[name])
    assert drawn['test_one.py'] == 1 and drawn['test_two.py'] == 2 and 1 < depth < 12
    assert gpu_report.quick_test_plan(tests, 16, plan_s) == plan
    assert gpu_report.quick_test_plan(tests, 16, plan_s, seed=1)['sample'] != plan['sample']
    assert gpu_report.quick_test_plan(tests, 16, 10_000)['sample'] == rest  # Room for all: the whole rest.
    assert gpu_report.quick_test_plan(tests, 16, 10)['sample'] == []  # Not even the start fits.


def test_quick_tests_are_collected_with_their_gpu_marks_and_run_as_selected(tmp_path, monkeypatch):
    """The collection (this module as a pytest plugin) records each test's node id and gpu mark; the selection runs
    exactly the tests it names, also those whose node ids hold spaces, which pytest would not take as arguments."""
    ctx = gpu_report.Context(workdir=str(tmp_path), outdir=str(tmp_path), quick=True, deadline=time.monotonic() + 300)
    tests = gpu_report.collect_tests(ctx, ['tests/test_generate.py', 'tests/test_dataset.py'])
    assert ctx.tests is tests and gpu_report.collect_tests(ctx) is tests  # Collected once.
    gpu = [t['id'] for t in tests if t['gpu']]
    assert gpu == [t['id'] for t in tests if t['id'].startswith('tests/test_generate.py::') and t['id'].endswith('[cuda]')]
    assert len(gpu) >= 1
    chosen = [t['id'] for t in tests if t['id'].startswith('tests/test_dataset.py::test_validate_names_the_bad_image[')
              and ' ' in t['id']][:2]
    assert len(chosen) == 2
    monkeypatch.setattr(gpu_report, '_test_workers', lambda: 1)
    result = gpu_report._run_selected(ctx, 'selected', chosen, 'two tests')
    assert result['ok'] and (result['tests'], result['passed']) == (2, 2), open(tmp_path / 'selected.log').read()
    assert 'Selected: two tests.' in gpu_report._suite_lines(result)


def _fake_step(key, plan, action=lambda ctx: None, needs=()):
    """A step planned at `plan` seconds that records the box it got, calls action(ctx) and succeeds."""
    def run(ctx):
        box = ctx.deadline - gpu_report.time.monotonic()
        action(ctx)
        return dict(ok=True, stopped_at_box=False, box_seen=box)
    return gpu_report.Step(key, key.capitalize(), run, {True: plan, False: plan}, needs)


def test_boxes_pass_on_unused_time_and_steps_that_no_longer_fit_are_not_started(tmp_path, monkeypatch):
    """With a fake clock: a step's box is its plan plus what earlier steps left beyond the later ones' plans (the
    budget less the seconds kept for the last report), and a step left less than half its plan is not started."""
    clock = [1000.0]
    monkeypatch.setattr(gpu_report, 'time', types.SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(gpu_report, 'process_start', lambda: 1000.0)

    def takes(seconds):
        return lambda ctx: clock.__setitem__(0, clock[0] + seconds)
    monkeypatch.setattr(gpu_report, 'STEPS', [_fake_step('a', 30), _fake_step('b', 30, takes(50)),
                                              _fake_step('c', 40, takes(46)), _fake_step('d', 10),
                                              _fake_step('gpu', 5, needs=('gpu',))])
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    result = CliRunner().invoke(gpu_report.main, ['--quick', f'--budget={100 + gpu_report.REPORT_RESERVE}',
                                                   '--outdir', str(tmp_path)])
    assert result.exit_code == 0, result.output  # Steps not run are listed, not failed.
    steps, _, text = _report(tmp_path)
    # a: 100 left, 80 planned after it (the gpu step cannot run here) -> its plan, 30. b: 100 left, 50 after -> 50.
    # c: 50 left, 10 after -> 40; it takes 46, which leaves 4 < 10 / 2 for d.
    assert [steps[k]['box_s'] for k in 'abc'] == [30, 50, 40]
    assert [steps[k]['result']['box_seen'] for k in 'abc'] == [30, 50, 40]
    assert steps['d']['status'] == 'not run' and steps['d']['why'] == 'budget spent (4 s of the 102 s left, planned 10 s)'
    assert steps['gpu']['why'] == 'no GPU'
    assert '| D | 10 |  |  | not run: budget spent (4 s of the 102 s left, planned 10 s) |' in text.splitlines()


def test_a_step_that_raises_ends_the_run_with_a_report_of_the_steps_before(tmp_path, monkeypatch):
    def crash(ctx):
        raise RuntimeError('no kernel image\nsecond line')
    monkeypatch.setattr(gpu_report, 'process_start', time.monotonic)  # This test's start, not pytest's.
    monkeypatch.setattr(gpu_report, 'STEPS', [_fake_step('first', 5), _fake_step('second', 5, crash), _fake_step('third', 5)])
    result = CliRunner().invoke(gpu_report.main, ['--quick', '--outdir', str(tmp_path)])
    assert result.exit_code == 1 and 'Failed: Second' in result.output
    steps, data, text = _report(tmp_path)
    assert steps['first']['status'] == 'ok' and steps['first']['result']['ok']
    assert steps['second']['status'] == 'crashed'
    assert steps['second']['why'] == 'RuntimeError: no kernel image (logs.tar.gz: crash-second.log)'
    assert (steps['third']['status'], steps['third']['why']) == ('not run', '"Second" crashed')
    assert data['stopped'] == 'Second crashed' and 'Not run: "Second" crashed.' in text
    with tarfile.open(tmp_path / 'logs.tar.gz') as tar:
        assert tar.getnames() == ['crash-second.log']
        log = tar.extractfile('crash-second.log').read().decode()
    assert 'Traceback' in log and 'in crash' in log and 'RuntimeError: no kernel image' in log


_SLEEPER = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])
with open(sys.argv[1] + '.tmp', 'w') as f:
    f.write(f'{os.getpid()} {child.pid}')
os.replace(sys.argv[1] + '.tmp', sys.argv[1])
time.sleep(600)
"""


def _sleeper(tmp_path):
    """A command that starts a process of its own, writes both pids to a file (returned) and sleeps."""
    (tmp_path / 'sleeper.py').write_text(_SLEEPER)
    return [sys.executable, str(tmp_path / 'sleeper.py'), str(tmp_path / 'pids')], tmp_path / 'pids'


_DRIVER = """
import os, sys
sys.path.insert(0, {root!r})
from bench import gpu_report

def quick(ctx):
    return dict(ok=True, stopped_at_box=False, value=42)

def sleeper(ctx):
    return gpu_report.run_child({command!r}, os.path.join(ctx.workdir, 'sleeper.log'), 600)

gpu_report.STEPS = [gpu_report.Step('quick', 'Quick', quick, {{True: 5, False: 5}}),
                    gpu_report.Step('sleeper', 'Sleeper', sleeper, {{True: 300, False: 300}}),
                    gpu_report.Step('after', 'After', quick, {{True: 5, False: 5}})]
gpu_report.main(['--quick', '--outdir', {outdir!r}])
"""


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT], ids=['SIGTERM', 'SIGINT'])
def test_a_signal_in_the_middle_of_a_step_leaves_a_report_and_ends_the_steps_processes(tmp_path, signum):
    """gpu_report as a process, in a step whose subprocess started one of its own: the signal ends both, the report
    holds the finished step, the stopped one and the one not reached, and the exit status is 128 + the signal."""
    command, pids = _sleeper(tmp_path)
    driver = tmp_path / 'driver.py'
    driver.write_text(_DRIVER.format(root=REPO_ROOT, command=command, outdir=str(tmp_path / 'out')))
    process = subprocess.Popen([sys.executable, str(driver)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not pids.exists():
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.1)
        sleepers = [psutil.Process(int(pid)) for pid in pids.read_text().split()]
        steps, _, _ = _report(tmp_path / 'out')  # Written when the step started: valid in the middle of it.
        assert steps['quick']['status'] == 'ok' and steps['sleeper']['status'] == 'running'
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    name = signal.Signals(signum).name
    assert process.returncode == 128 + signum, (stdout, stderr)
    assert stderr.strip().splitlines()[-1] == f'Error: stopped by {name}; {tmp_path / "out" / "report.md"} holds the ' \
                                              'steps that finished'
    _, alive = psutil.wait_procs(sleepers, timeout=30)
    assert not alive  # The step's subprocess and the one it started.
    steps, data, text = _report(tmp_path / 'out')
    assert steps['quick']['status'] == 'ok' and steps['quick']['result']['value'] == 42
    assert steps['sleeper']['status'] == f'stopped by {name}' and steps['sleeper']['result'] is None
    assert (steps['after']['status'], steps['after']['why']) == ('not run', f'stopped by {name} during "Sleeper"')
    assert data['stopped'] == name and f'Not run: stopped by {name} during "Sleeper".' in text
    assert sorted(os.listdir(tmp_path / 'out')) == ['logs.tar.gz', 'report.json', 'report.md']
    with tarfile.open(tmp_path / 'out' / 'logs.tar.gz') as tar:
        assert tar.getnames() == ['sleeper.log']


def test_a_subprocess_is_stopped_at_its_box_with_the_processes_it_started(tmp_path):
    command, pids = _sleeper(tmp_path)
    child = gpu_report.Child(command, str(tmp_path / 'sleeper.log'))
    deadline = time.monotonic() + 120
    while not pids.exists():
        assert child.process.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    result = child.result(child.wait(time.monotonic() + 2, grace=1))
    assert result['stopped_at_box'] and result['returncode'] is None and not result['ok']
    _, alive = psutil.wait_procs([psutil.Process(int(pid)) for pid in pids.read_text().split()[1:]], timeout=30)
    assert not alive


def test_pytest_stopped_by_sigint_reports_the_tests_that_finished(tmp_path):
    """What the test-suite step relies on at its box: stopped as it stops the suite, pytest still writes the JUnit
    XML, with the tests that finished, also when the report itself was started with SIGINT ignored."""
    (tmp_path / 'pytest.ini').write_text('[pytest]\n')
    (tmp_path / 'test_two.py').write_text(textwrap.dedent(f"""
        import time
        def test_fast():
            pass
        def test_slow():
            open({str(tmp_path / 'started')!r}, 'w').close()
            time.sleep(600)
        """))
    xml = tmp_path / 'tests.xml'
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # As a non-interactive shell starts a background job.
    try:
        child = gpu_report.Child([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-c', str(tmp_path / 'pytest.ini'),
                                  str(tmp_path / 'test_two.py'), f'--junitxml={xml}'], str(tmp_path / 'tests.log'))
    finally:
        signal.signal(signal.SIGINT, previous)
    deadline = time.monotonic() + 120
    while not (tmp_path / 'started').exists():
        assert child.process.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    child.stop(**gpu_report.SUITE_STOP)
    counts = gpu_report.suite_counts(str(xml))
    assert (counts['passed'], counts['failures'], counts['errors']) == (1, 0, 0)


@pytest.mark.skipif(torch.version.cuda is not None, reason='a CUDA build of torch would build the plugins here')
def test_build_step_reports_each_plugins_cause(tmp_path):
    """The build step's subprocesses (one per plugin, at once) on this CPU build of torch: each plugin's failure comes
    back with custom_ops' one-line cause, and nothing is loaded."""
    ctx = gpu_report.Context(workdir=str(tmp_path), outdir=str(tmp_path), quick=True, deadline=time.monotonic() + 300)
    result = gpu_report.build(ctx)
    assert not result['ok'] and not result['stopped_at_box'] and list(result['plugins']) == ['bias_act', 'upfirdn2d']
    for name, plugin in result['plugins'].items():
        assert not plugin['ok'] and plugin['returncode'] == 0 and plugin['log'] == f'logs.tar.gz: build-{name}.log'
        assert plugin['cause'] == f'this PyTorch build ({torch.__version__}) has no CUDA support'
        assert f'- {name}: **FAILED** after ' in '\n'.join(gpu_report._build_lines(result))
    assert all(p.module is None for p in gpu_report.PLUGINS.values())


@pytest.mark.parametrize('plugin_class, failing', [(HostPlugin, set()), (UpsamplingOnePercentOff, {'upsample2d', 'downsample2d'})],
                         ids=['right', 'upsampling-off'])
def test_self_check_step_measures_every_configuration(tmp_path, host_kernels, cpu_kernel_path, plugin_class, failing):
    """The self-check step on the CPU route through the kernels (tests/support/host_plugin.py): a row per op and dtype with the
    error measured against the float64 reference; a kernel whose upsampling is 1% off fails the rows that upsample
    (2x upsampling, and 2x downsampling's gradient) in float32 only; a box already spent stops the step before its
    first check."""
    cpu_kernel_path(plugin_class(host_kernels))
    ctx = gpu_report.Context(workdir=str(tmp_path), outdir=str(tmp_path), quick=True, deadline=time.monotonic() + 600)
    with pytest.warns(RuntimeWarning) if failing else contextlib.nullcontext():
        result = gpu_report.self_check(ctx, device=torch.device('cpu'))
    rows = result['rows']
    ops = [f'bias_act {act}' for act in bias_act.activation_funcs] + ['filter2d [1,2,1]'] + [
        f'{direction}2d {name}' for name in ('[1,2,1]', 'box', '[1,3,3,1]') for direction in ('upsample', 'downsample')]
    assert sorted((r['op'], r['dtype']) for r in rows) == sorted((op, dtype) for op in ops
                                                                 for dtype in ('float32', 'float16', 'bfloat16'))
    for row in rows:
        assert row['tolerance'] == kernel_choice.SELF_CHECK_TOLERANCE[getattr(torch, row['dtype'])]
        wrong = row['op'].split()[0] in failing and row['dtype'] == 'float32'  # 1% is within fp16's and bf16's tolerance.
        assert row['ok'] == (not wrong) == (row['error'] <= row['tolerance']) == (row['cause'] is None), row
    assert result['ok'] == (not failing) and not result['stopped_at_box']
    ctx.deadline = time.monotonic() - 1
    assert gpu_report.self_check(ctx, device=torch.device('cpu')) == dict(
        ok=True, stopped_at_box=True, rows=[], note=f'stopped at its time box after 0 of {len(rows)} calls')


def test_markdown_flags_failed_checks_and_lists_choices():
    report = gpu_report.Report('.', '.', quick=True, budget=360, steps=gpu_report.planned_steps(True), start=0.0)
    report.step('environment').update(status='ok', result=gpu_report.environment(None), box_s=5, seconds=0.1)
    report.step('self_check').update(status='failed', why=None, box_s=10, seconds=1.0, result=dict(ok=False, rows=[dict(
        op='upfirdn2d', dtype='float16', error=float('nan'), tolerance=0.02, where='exception', ms=3.0, ok=False,
        cause='RuntimeError: no kernel image')]))
    report.step('choices').update(status='stopped at its time box', why=None, box_s=15, seconds=15.2, result=dict(
        ok=True, stopped_at_box=True, note='stopped at its time box after 1 of 60 calls', rows=[dict(
            op='filter2d [1,2,1]', shape='[16, 512, 8, 8]', dtype='float32', kernel_ms=0.25, reference_ms=0.125,
            chosen='reference')]))
    lines = gpu_report.markdown(report.data).splitlines()
    assert any('RuntimeError: no kernel image' in line and 'False' in line for line in lines)
    assert '**Failed** after 1 s (box 10 s).' in lines
    assert any(line.startswith('| filter2d [1,2,1]') and '0.125' in line and 'reference' in line for line in lines)
    assert '**Stopped at its time box** after 15 s (box 15 s).' in lines
    assert 'stopped at its time box after 1 of 60 calls.' in lines
    assert '| A sample of the other tests (python -m pytest, GPU visible) | 50 |  |  | not run: not reached yet |' in lines


def test_suite_results_name_each_failure(tmp_path, monkeypatch):
    """pytest-xdist's JUnit XML (one testsuite per run, under testsuites) is counted and each failure named."""
    xml = """<testsuites><testsuite tests="5" failures="1" errors="1" skipped="1">
      <testcase classname="tests.test_a" name="test_ok"/>
      <testcase classname="tests.test_a" name="test_bad"><failure message="assert 1 == 2"/></testcase>
      <testcase classname="tests.test_b" name="test_broken"><error message="fixture failed"/></testcase>
      <testcase classname="tests.test_b" name="test_gpu"><skipped/></testcase>
      <testcase classname="tests.test_b" name="test_ok2"/></testsuite></testsuites>"""

    def fake_run(command, log_path, box, **stop_kwargs):
        assert stop_kwargs == gpu_report.SUITE_STOP
        xml_arg = next(a for a in command if a.startswith('--junitxml='))
        with open(xml_arg.split('=', 1)[1], 'w') as f:
            f.write(xml)
        return dict(command=' '.join(command), returncode=1, seconds=2.0, log='tests.log', stopped_at_box=False, ok=False)
    monkeypatch.setattr(gpu_report, 'run_child', fake_run)
    ctx = gpu_report.Context(workdir=str(tmp_path), outdir=str(tmp_path), quick=True, deadline=time.monotonic() + 60)
    result = gpu_report.run_test_suite(ctx)
    assert (result['passed'], result['failures'], result['errors'], result['skipped']) == (2, 1, 1, 1)
    assert result['failed'] == [dict(test='tests.test_a::test_bad', message='assert 1 == 2'),
                                dict(test='tests.test_b::test_broken', message='fixture failed')]


def test_digits_run_is_stopped_by_its_time_box_and_its_last_snapshot_scored(tmp_path, monkeypatch):
    """A run far longer than its time box (20 s of training; yet short enough to end by itself, should the test be
    killed and leave it running) is stopped; its last (whole) snapshot goes to the
    scoring (next test) and its grid is kept; every log goes into one archive. Narrow networks with a snapshot at
    every step, so that the box holds several on a loaded CPU."""
    monkeypatch.setattr(gpu_report, 'DIGITS_COMMAND', [
        'train.py', '--cfg=gn-stylegan', '--data=data/digits32.zip', '--cmax=4', '--map-dim=16', '--batch=4',
        '--lod-kimg=0.02', '--kimg=4', '--xflip=0', '--tick=0.004', '--snap=1', '--workers=0'])  # Ends by itself if orphaned.
    scored = []

    def score_digits(ctx, snapshot, device, score_args):
        scored.append((snapshot, device, ctx.deadline - time.monotonic()))
        assert score_args == ()  # The GPU's scoring: the default number of images and epochs.
        open(os.path.join(ctx.workdir, 'digits-quality.log'), 'w').close()
        return dict(ok=True, stopped_at_box=False)
    monkeypatch.setattr(gpu_report, 'score_digits', score_digits)
    workdir, outdir = tmp_path / 'work', tmp_path / 'out'
    workdir.mkdir()
    outdir.mkdir()
    box = gpu_report.DIGITS_SCORING + 20
    ctx = gpu_report.Context(workdir=str(workdir), outdir=str(outdir), quick=True, deadline=time.monotonic() + box)
    result = gpu_report.digits_run(ctx, device='cpu')
    assert result['returncode'] == 'stopped after the time box' and result['ok'] and not result['stopped_at_box']
    run_dir = os.path.dirname(scored[0][0])
    snapshots = sorted(name for name in os.listdir(run_dir) if name.startswith('network-snapshot-'))
    assert len(snapshots) >= 2 and result['snapshot'] == snapshots[-1] and scored[0][:2] == (
        os.path.join(run_dir, snapshots[-1]), 'cpu')
    assert 0 < scored[0][2] <= gpu_report.DIGITS_SCORING  # The scoring gets the rest of the box.
    grids = sorted(name for name in os.listdir(run_dir) if name.startswith('fakes0'))
    assert (outdir / 'digits-fakes.png').read_bytes() == open(os.path.join(run_dir, grids[-1]), 'rb').read()
    report = gpu_report.Report(str(outdir), str(workdir), quick=True, budget=360, steps=gpu_report.planned_steps(True),
                               start=time.monotonic())
    report.write()
    with tarfile.open(outdir / 'logs.tar.gz') as tar:
        assert sorted(tar.getnames()) == ['digits-quality.log', 'digits-train.log']


def test_stylegan2_digits_comparison_runs_and_is_reported(tmp_path, monkeypatch):
    """The gn-stylegan2 comparison step through the real bench/compare.py and train.py, narrowed (two settings, 8 real
    images, a judge trained for one epoch): each run's final scores come back in the report, the samples are kept."""
    quick_compare = ("from bench import compare; judge = compare.trained_judge; "
                     "compare.trained_judge = lambda epochs, seed: judge(1, seed); compare.main()")
    monkeypatch.setattr(gpu_report, 'SG2_DIGITS_COMPARE', ['-c', quick_compare, '--cfg=gn-stylegan2', '--seeds=0',
                                                           '--settings=gn:hinge,none:ns', '--kimg=0.008', '--snaps=1', '--num=20'])
    monkeypatch.setattr(gpu_report, 'SG2_DIGITS_EXTRA', '--cmax=4 --map-dim=8 --batch=4 --workers=0')
    workdir, outdir = tmp_path / 'work', tmp_path / 'out'
    workdir.mkdir()
    outdir.mkdir()
    ctx = gpu_report.Context(workdir=str(workdir), outdir=str(outdir), quick=False, deadline=time.monotonic() + 300)
    result = gpu_report.digits_stylegan2_run(ctx, device='cpu')
    assert result['ok'], open(workdir / 'digits-stylegan2.log').read()
    written = json.load(open(workdir / 'compare-stylegan2' / 'results.json'))['runs']
    assert [row['run'] for row in result['runs']] == ['gn-hinge-seed0', 'none-ns-seed0']
    for row, run in zip(result['runs'], written):
        assert row == dict({k: v for k, v in run['snapshots'][-1].items() if k != 'path'}, run=row['run'],
                           sec_per_kimg=run['sec_per_kimg'])
        assert row['kimg'] == 0.008
    assert (outdir / 'digits-stylegan2.png').read_bytes() == (workdir / 'compare-stylegan2' / 'samples.png').read_bytes()
    lines = gpu_report.RENDER['digits_stylegan2'](result)
    assert lines[1] == 'Samples of the final snapshots: digits-stylegan2.png.'
    assert sum(line.startswith('| gn-hinge-seed0 |') or line.startswith('| none-ns-seed0 |') for line in lines) == 2


def test_stylegan2_digits_comparison_is_the_one_in_the_docs():
    """The GPU runs docs/results.md's command: its settings, length, snapshots, samples and networks (one seed)."""
    import shlex
    text = open(os.path.join(REPO_ROOT, 'docs', 'results.md')).read()
    command = text[text.index('python -m bench.compare --out=compare-stylegan2'):]
    docs = dict(arg.split('=', 1) for arg in shlex.split(command[:command.index('```')].replace('\\\n', ' '))[3:])
    assert gpu_report.SG2_DIGITS_COMPARE[:2] == ['-m', 'bench.compare']
    ours = dict(arg.split('=', 1) for arg in gpu_report.SG2_DIGITS_COMPARE[2:])
    assert ours.pop('--seeds') == '0' and docs.pop('--seeds').startswith('0') and docs.pop('--out')
    assert docs == dict(ours, **{'--extra': gpu_report.SG2_DIGITS_EXTRA})


def test_digits_snapshot_is_scored(tmp_path):
    """The scoring of the digits step (bench/quickstart_quality.py in a subprocess) on a snapshot of untrained
    GN-StyleGAN networks for the digits: its table comes back with the snapshot's row."""
    from torch_utils import persistence
    from training.experiment import Experiment
    import dnnlib
    opts = Experiment.build(cfg='gn-stylegan', img_resolution=32, img_channels=1, cmax=4, map_dim=16, batch=4)
    nets = {name: dnnlib.util.construct_class_by_name(**kwargs) for name, kwargs in
            [('G', opts.G_kwargs), ('D', opts.D_kwargs), ('G_ema', opts.G_kwargs)]}
    persistence.save_snapshot(str(tmp_path / 'network-snapshot-000001.pkl'), nets)
    ctx = gpu_report.Context(workdir=str(tmp_path), outdir=str(tmp_path), quick=True, deadline=time.monotonic() + 300)
    result = gpu_report.score_digits(ctx, str(tmp_path / 'network-snapshot-000001.pkl'), 'cpu', ('--num=20', '--epochs=1'))
    assert result['ok'] and result['returncode'] == 0 and result['log'] == 'logs.tar.gz: digits-quality.log'
    rows = result['data']['rows']
    assert rows[0]['name'].startswith('real digits') and rows[1]['name'] == str(tmp_path / 'network-snapshot-000001.pkl')
    assert rows[1]['num'] == 20 and 0 <= rows[1]['confident'] <= 1


def test_targets_read_what_the_steps_measured_and_say_what_was_not():
    """Each target of the training step (module docstring) is taken from its step's JSON, compared with its bound, or
    listed as not measured (no authors' code given, a step that did not run)."""
    def entry(key, data):
        return dict(key=key, result=None if data is None else dict(ok=True, data=data))
    speed = dict(gn_over_vanilla=[dict(cfg='cifar10-resnet', precision='tf32', cuda_graphs='on', iteration=1.3),
                                  dict(cfg='cifar10-resnet', precision='tf32', cuda_graphs='off', iteration=1.7)],
                 ours_over_authors=[dict(cfg='cifar10-resnet', norm='gn', precision='tf32', cuda_graphs='on', iteration=0.5),
                                    dict(cfg='cifar10-resnet', norm='gn', precision='tf32', cuda_graphs='off', iteration=0.9)])
    presets = dict(results=[dict(cfg='cifar10-cnn', precision='tf32', sec_per_iteration=0.02),
                            dict(cfg='cifar10-cnn', precision='bf16', sec_per_iteration=0.015),
                            dict(cfg='cifar10-resnet', precision='tf32', sec_per_iteration=0.04),
                            dict(cfg='cifar10-resnet', precision='bf16', sec_per_iteration=0.05)])
    digits = dict(results=[dict(cuda_graphs='off', sec_per_iteration=0.05), dict(cuda_graphs='on', sec_per_iteration=0.012)])
    data = dict(steps=[entry('train_speed', speed), entry('train_speed_presets', presets),
                       entry('train_speed_digits', digits), entry('stylegan', None)])
    rows = {row['target']: row for row in gpu_report.targets(data)}
    gn = rows["cifar10-resnet iteration, GN, CUDA graphs, tf32: ours / the authors' code"]
    assert (gn['measured'], gn['met']) == (0.5, False)  # The graph row, not the eager one (0.9).
    assert rows["cifar10-resnet iteration, no constraint, CUDA graphs, tf32: ours / the authors' code"]['measured'] is None
    assert (rows['cifar10-resnet iteration, CUDA graphs, tf32: GN / no constraint']['met'],
            rows['cifar10-cnn iteration: bf16 / tf32']['met'], rows['cifar10-resnet iteration: bf16 / tf32']['met']) == (
        True, True, False)
    assert rows['cifar10-cnn iteration: bf16 / tf32']['measured'] == pytest.approx(0.75)
    assert rows['stl10-cnn iteration: bf16 / tf32']['measured'] is None
    digit = rows['gn-stylegan --cmax=32 digits step (D + G, batch 32), CUDA graphs, tf32, seconds']
    assert (digit['measured'], digit['met']) == (0.012, True)
    lines = gpu_report._target_lines(dict(data, steps=data['steps']))
    assert any('no constraint' in line and 'not measured' in line for line in lines)
    assert any('cifar10-resnet iteration: bf16 / tf32' in line and '**no**' in line for line in lines)


@pytest.mark.skipif(torch.cuda.is_available(), reason='with a GPU the check itself runs (and its test sample must not '
                    'draw minutes of its rehearsal)')
def test_the_quick_plan_rehearsed_on_the_cpu_runs_every_step(tmp_path):
    """`--quick --rehearse`: every step of the quick plan on this CPU with the GPU's command lines at their smallest
    sizes, the CUDA-only steps named as skipped; a step that fails (a bench program that stops with a traceback on
    the command line the GPU would run) fails this test with the last line of its log."""
    outdir = tmp_path / 'rehearsal'
    result = subprocess.run([sys.executable, '-m', 'bench.gpu_report', '--quick', '--rehearse', f'--outdir={outdir}'],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=1500)
    steps, data, text = _report(outdir)
    not_ok = {key: (entry['status'], entry['why'], (entry['result'] or {}).get('last_line'))
              for key, entry in steps.items() if entry['status'] not in ('ok', 'skipped')}
    assert not_ok == {} and result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert list(steps) == [step.key for step in gpu_report.planned_steps(True)] and data['rehearsal']
    assert {key for key, entry in steps.items() if entry['status'] == 'skipped'} == {'build', 'self_check', 'choices'}
    assert '| Build (torch_utils/custom_ops.py) | 60 |  |  | skipped: CUDA only: the plugins\' build needs a CUDA' in text
    # The GPU's command lines at their smallest sizes: one timed round of each configuration, eager, on the CPU.
    digits = steps['train_speed_digits']['result']['data']['results']
    assert [(r['cfg'], r['norm'], r['fast_g'], r['batch_D'], r['rounds'], r['cuda_graphs']) for r in digits] == [
        ('gn-stylegan', 'gn', False, 4, 1, 'off')]
    presets = steps['train_speed_presets']['result']['data']['results']
    assert sorted({r['cfg'] for r in presets}) == sorted(gpu_report.SNGAN_PRESETS.split(','))
    assert steps['first_tests']['result']['tests'] == steps['test_sample']['result']['tests'] == gpu_report.REHEARSAL_TESTS
    assert steps['stylegan']['result']['note'] == 'bench.stylegan needs a CUDA GPU: its command line parsed, not run'
    assert 'Not rehearsed (CUDA only): the CUDA-graph rows (--cuda-graphs=off here)' in text
    assert steps['digits']['result']['score']['ok'] and (outdir / 'digits-fakes.png').stat().st_size > 0
    assert '### CUDA graphs on this torch' not in text and '### Targets' not in text  # A CPU verifies and meets nothing.


def test_the_rehearsal_replaces_the_sizes_and_parses_what_needs_cuda():
    ctx = gpu_report.Context(workdir='.', outdir='.', quick=True, rehearse=True)
    assert gpu_report.rehearsed(['--cfg=gn-stylegan', '--cmax=32', '--rounds=3', '--cuda-graphs=both'],
                                {'--cmax': '4', '--rounds': '1', '--cuda-graphs': 'off', '--device': 'cpu'}, ctx) == [
        '--cfg=gn-stylegan', '--cmax=4', '--rounds=1', '--cuda-graphs=off', '--device=cpu']
    assert gpu_report.rehearsed(['--cmax=32'], {'--cmax': '4'}, dataclasses.replace(ctx, rehearse=False)) == ['--cmax=32']
    assert gpu_report.parse_only('bench.ops', ['--repeats=5', '--sizes=8,32'])['ok']
    refused = gpu_report.parse_only('bench.stylegan', ['--resolutions=256', '--max-resolution=2048'])
    assert not refused['ok'] and "'--max-resolution': '2048' is not one of" in refused['last_line']


def _gpu_data(first_tests, gpus=({'name': 'NVIDIA H200', 'capability': '9.0', 'memory_gib': 139.8},)):
    env = dict(date='2026-12-06T15:00:00+00:00', torch='2.11.0+cu130', gpus=list(gpus), commit='0123456789ab')
    return dict(rehearsal=False, steps=[dict(key='environment', status='ok', result=env), first_tests])


def test_a_report_whose_graph_tests_passed_ends_with_the_line_that_verifies_its_release():
    passed = dict(key='first_tests', status='ok', result=dict(tests=347, failures=0, errors=0))
    assert gpu_report.graphs_verified_entry(_gpu_data(passed)) == (
        "    (2, 11): 'NVIDIA H200 (sm 9.0), torch 2.11.0+cu130, 2026-12-06, commit 0123456789ab',")
    lines = gpu_report._verified_lines(_gpu_data(passed))
    assert lines[-1] == gpu_report.graphs_verified_entry(_gpu_data(passed)) and '`CUDA_GRAPHS_VERIFIED`' in lines[-3]
    failed = dict(passed, status='failed', result=dict(tests=347, failures=1, errors=0))
    for data in (_gpu_data(failed), _gpu_data(dict(passed, result=dict(tests=0, failures=0, errors=0))),
                 _gpu_data(passed, gpus=()), dict(_gpu_data(passed), rehearsal=True),
                 _gpu_data(dict(passed, status='not run', result=None))):
        assert gpu_report.graphs_verified_entry(data) is None
    assert gpu_report._verified_lines(_gpu_data(failed))[-1].startswith('The CUDA-graph tests did not pass here')
