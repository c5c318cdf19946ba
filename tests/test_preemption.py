"""A run stopped by SIGTERM or SIGUSR1 and continued ends as if it had never stopped.

In-process (training/training_loop.py with width-2 networks): a stop between ticks writes a snapshot of the G
step, and the continued run ticks, writes its snapshots and counts its statistics at the same kimg as an
uninterrupted run, every tensor equal; a stop during a metric evaluation abandons it. As a user runs it
(train.py in processes, tests/support/signal_at_step.py sending the signal at a G step): one process signalled with
its DataLoader workers, as a scheduler signals every process of a job, twice in a row; two gloo processes
whose parent train.py passes SIGUSR1 on; a second signal that ends the run at once while it writes the
snapshot; the processes of --gpus=2 signalled while they start. Each is continued by the command the stopped
run printed (--resume=latest).
"""

import functools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from tests.support import runs
from tests.support.runs import only_run_dir, snapshots
from tests.support.stand_ins import make_detector, write_dataset_zip
from tests.support.tiny_runs import assert_same_snapshot, tiny_experiment
from torch_utils import persistence
from training import training_loop
from training.run.stop_signal import RunStopped
from training.step.updater import NetworkUpdater

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.usefixtures('tiny_preset')  # --cfg=tiny (tests/support/tiny_runs.py)
REQUEUE_STATUS = 75  # The documented status of a stopped run, a literal: the README's requeue recipe tests `$? -eq 75`.

#----------------------------------------------------------------------------


def signal_at_call(monkeypatch, cls, name, call, signum):
    """Have cls.name send this process `signum` when it is called the `call`-th time."""
    original, calls = getattr(cls, name), []

    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            os.kill(os.getpid(), signum)
        return original(*args, **kwargs)
    monkeypatch.setattr(cls, name, wrapped)

#----------------------------------------------------------------------------
# In-process.


def test_stop_between_ticks_continues_bit_for_bit(tmp_path, monkeypatch):
    """Ticks of 2 G steps, a snapshot every 2 ticks (steps 4 and 8). SIGUSR1 during step 3: a snapshot of step 3,
    taken mid-tick; the continued run still ticks at steps 4, 6, 8 and writes the snapshots of steps 4 and 8 equal
    to those of the run that never stopped."""
    write_dataset_zip(str(tmp_path / 'data.zip'), num_images=12, resolution=8)
    experiment = tiny_experiment(str(tmp_path / 'data.zip'), steps=8, batch=2, tick=0.004, snap=2)
    full, stopped = tmp_path / 'full', tmp_path / 'stopped'
    full.mkdir()
    stopped.mkdir()
    training_loop.training_loop(experiment, run_dir=str(full))

    handler = signal.getsignal(signal.SIGUSR1)
    with monkeypatch.context() as patch:
        signal_at_call(patch, NetworkUpdater, 'update_ema', 3, signal.SIGUSR1)
        with pytest.raises(RunStopped) as stop:
            training_loop.training_loop(experiment, run_dir=str(stopped))
    assert (stop.value.signal_name, stop.value.step) == ('SIGUSR1', 3)
    assert stop.value.snapshot == str(stopped / 'network-snapshot-000000.006.pkl')  # 3 steps of 2 images.
    assert snapshots(stopped) == ['network-snapshot-000000.006.pkl']
    progress = persistence.load_snapshot(stop.value.snapshot).progress
    assert (progress.step, progress.cur_nimg, progress.cur_tick, progress.tick_start_nimg) == (3, 6, 1, 4)
    assert signal.getsignal(signal.SIGUSR1) == handler  # The run's handler is gone with the run.

    training_loop.training_loop(experiment, run_dir=str(stopped), resume=persistence.load_snapshot(stop.value.snapshot))
    assert snapshots(stopped) == ['network-snapshot-000000.006.pkl'] + snapshots(full)
    for name in snapshots(full):
        assert_same_snapshot(full / name, stopped / name)
    ticks = lambda run_dir: [json.loads(line) for line in open(run_dir / 'stats.jsonl')]
    kimg = lambda entry: entry['Progress/kimg']['mean']
    assert [kimg(e) for e in ticks(stopped)] == [kimg(e) for e in ticks(full)] == [0.004, 0.008, 0.012, 0.016]
    # A tick's mean is the difference of running float64 totals (torch_utils/training_stats.py), and the resumed run's
    # totals start again at 0: the same steps' means agree to float64 rounding, their counts exactly.
    losses = lambda entries: [(e['Loss/D/loss']['mean'], e['Loss/D/loss']['num']) for e in entries]
    near = lambda entries: [(pytest.approx(mean, rel=1e-12), num) for mean, num in losses(entries)]
    # Tick 2 of the stopped run counts step 4 only (step 3's statistics went with the stopped process); the others
    # are the same steps.
    assert losses(ticks(stopped))[2:] == near(ticks(full))[2:] and losses(ticks(stopped))[0] == near(ticks(full))[0]
    assert ticks(stopped)[1]['Loss/D/loss']['num'] == ticks(full)[1]['Loss/D/loss']['num'] // 2


def test_stop_abandons_the_metric_evaluation_in_progress(tmp_path, monkeypatch, capsys):
    """A snapshot every G step with FID. SIGTERM as the second evaluation begins: it is abandoned after its first
    batch, the snapshot of that step is written (without the metric) and the run stops with it."""
    from metrics import detectors, metric_main
    monkeypatch.setenv('GNGAN_CACHE_DIR', str(tmp_path / 'cache'))
    make_detector(str(tmp_path / 'detector.pt'))
    write_dataset_zip(str(tmp_path / 'data.zip'), num_images=8, resolution=8)
    batches = []
    monkeypatch.setattr(detectors, 'run_detector', functools.partial(
        lambda run, *args, **kwargs: batches.append(1) or run(*args, **kwargs), detectors.run_detector))
    monkeypatch.setattr(metric_main, 'calc_metric', functools.partial(metric_main.calc_metric, num_gen=256, max_real=8))
    signal_at_call(monkeypatch, metric_main, 'calc_metric', 2, signal.SIGTERM)
    run_dir = tmp_path / 'run'
    run_dir.mkdir()
    experiment = tiny_experiment(str(tmp_path / 'data.zip'), steps=4, batch=2, tick=0.002, snap=1, metrics=('fid50k_full',),
                                  detector=str(tmp_path / 'detector.pt'))
    with pytest.raises(RunStopped) as stop:
        training_loop.training_loop(experiment, run_dir=str(run_dir))
    assert (stop.value.step, stop.value.snapshot) == (2, str(run_dir / 'network-snapshot-000000.004.pkl'))
    assert snapshots(run_dir) == ['network-snapshot-000000.002.pkl', 'network-snapshot-000000.004.pkl']
    assert len(open(run_dir / 'metric-fid50k_full.jsonl').readlines()) == 1
    # First evaluation: 8 reals in one batch, 256 fakes in 4 batches of 64; the second: its first batch of fakes.
    assert len(batches) == 1 + 4 + 1
    assert 'Evaluation of fid50k_full abandoned: stop requested by SIGTERM' in capsys.readouterr().out

#----------------------------------------------------------------------------
# As a user runs it: train.py in processes.


def test_the_requeue_recipe_tests_the_status_of_a_stopped_run():
    """What the README's scripts compare the exit status with is REQUEUE_STATUS, which the stopped runs below exit with."""
    readme = open(os.path.join(REPO_ROOT, 'README.md')).read()
    assert re.findall(r'\$\? -eq (\d+)', readme) == [str(REQUEUE_STATUS)]

QUICK = ['--steps=6', '--batch=4', '--tick=0.008', '--snap=2']  # The digits; ticks of 2 steps, snapshots at steps 4 and 6.
# train.py under tests/support/signal_at_step.py, in its own process group (SIGNAL_TO=group stays in it).
run_train = functools.partial(runs.run_train, script='tests/support/signal_at_step.py')


def continue_as_printed(result):
    """Run the command of the 'Stopped by ...' line that a stopped run printed; return its result."""
    lines = [line for line in result.stdout.splitlines() if line.startswith('Stopped by ')]
    assert len(lines) == 1, result.stdout[-3000:]
    command = shlex.split(lines[0].split('; continue with: ', 1)[1])
    assert command[0] == 'python' and command[-1] == '--resume=latest'
    return run_train(*command[2:], script=command[1])


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
    """The quick start of QUICK with 2 DataLoader workers, never stopped: its run directory."""
    outdir = tmp_path_factory.mktemp('uninterrupted')
    result = run_train(f'--outdir={outdir}', *QUICK, '--workers=2', script='train.py')
    assert result.returncode == 0, result.stderr[-3000:]
    return only_run_dir(outdir)


def test_stopped_quick_start_continues_as_if_never_stopped(tmp_path, uninterrupted):
    """SIGTERM to train.py and its DataLoader workers, twice in a row (a scheduler and a launcher), during G step 3:
    one request; a snapshot of step 3, one line with the command that continues, exit 75, no traceback. That
    command continues the run in its directory and ends with the same snapshots."""
    outdir = tmp_path / 'runs'
    result = run_train(f'--outdir={outdir}', *QUICK, '--workers=2',
                       env=dict(SIGNAL_AT_STEP='3', SIGNAL_TO='group', SIGNAL_NAME='SIGTERM'))
    assert result.returncode == REQUEUE_STATUS, result.stderr[-3000:]
    assert 'Traceback' not in result.stderr + result.stdout
    run_dir = only_run_dir(outdir)
    assert re.search(rf'^Stopped by SIGTERM after G step 3, snapshot {re.escape(run_dir)}/network-snapshot-000000.012.pkl; '
                     rf'continue with: python tests/support/signal_at_step.py --outdir={re.escape(str(outdir))} .*--resume=latest$',
                     result.stdout, re.M)
    assert snapshots(run_dir) == ['network-snapshot-000000.012.pkl']

    continued = continue_as_printed(result)
    assert continued.returncode == 0, continued.stderr[-3000:]
    assert only_run_dir(outdir) == run_dir  # Continued in place.
    assert snapshots(run_dir) == ['network-snapshot-000000.012.pkl'] + snapshots(uninterrupted)
    for name in snapshots(uninterrupted):
        assert_same_snapshot(os.path.join(uninterrupted, name), os.path.join(run_dir, name))
    log = open(os.path.join(run_dir, 'log.txt')).read()
    assert log.count('Stopped by SIGTERM') == 1 and log.count('Resumed at G step 3') == 1  # Both sessions.


def test_second_signal_ends_the_run_at_once(tmp_path, uninterrupted):
    """SIGTERM during G step 5, then again while the snapshot of step 5 is being written (its bytes written, not yet
    renamed): the run ends there, killed by the signal. The snapshot of step 4 is as it was; the temporary file
    left behind is removed by the continued run, which resumes from step 4 and ends as the uninterrupted one."""
    outdir = tmp_path / 'runs'
    result = run_train(f'--outdir={outdir}', *QUICK, '--workers=2', env=dict(SIGNAL_AT_STEP='5', SECOND_SIGNAL='1'))
    assert result.returncode == -signal.SIGTERM, (result.returncode, result.stderr[-3000:])
    run_dir = only_run_dir(outdir)
    assert snapshots(run_dir) == ['network-snapshot-000000.016.pkl']
    assert_same_snapshot(os.path.join(uninterrupted, 'network-snapshot-000000.016.pkl'),
                         os.path.join(run_dir, 'network-snapshot-000000.016.pkl'))
    temporaries = [f for f in os.listdir(run_dir) if f.endswith('.tmp')]
    assert len(temporaries) == 1 and temporaries[0].startswith('.network-snapshot-000000.020.pkl.')

    continued = run_train(f'--outdir={outdir}', *QUICK, '--workers=2', '--resume=latest', script='train.py')
    assert continued.returncode == 0, continued.stderr[-3000:]
    assert 'Resuming from "' + os.path.join(run_dir, 'network-snapshot-000000.016.pkl') in continued.stdout
    assert not [f for f in os.listdir(run_dir) if f.endswith('.tmp')]
    assert_same_snapshot(os.path.join(uninterrupted, 'network-snapshot-000000.024.pkl'),
                         os.path.join(run_dir, 'network-snapshot-000000.024.pkl'))


def test_two_processes_stop_together_and_continue(tmp_path):
    """train.py --gpus=2 (gloo) receives SIGUSR1 during G step 3 of process 0 and passes it on: both processes stop
    after the same step, process 0 writes the snapshot, train.py exits 75. Continued with --resume=latest by two
    processes, the run ends with the snapshots of an uninterrupted --gpus=2 run."""
    common = [*QUICK, '--gpus=2', '--workers=0']
    full = run_train(f'--outdir={tmp_path / "full"}', *common, script='train.py')
    assert full.returncode == 0, full.stderr[-3000:]
    outdir = tmp_path / 'runs'
    result = run_train(f'--outdir={outdir}', *common, env=dict(SIGNAL_AT_STEP='3', SIGNAL_TO='parent', SIGNAL_NAME='SIGUSR1'))
    assert result.returncode == REQUEUE_STATUS, result.stderr[-3000:]
    assert 'Traceback' not in result.stderr + result.stdout
    run_dir = only_run_dir(outdir)
    stop = persistence.load_snapshot(os.path.join(run_dir, snapshots(run_dir)[-1]))
    assert stop.progress.step >= 3 and len(stop.rng_states) == 2  # Gathered from both processes.

    continued = continue_as_printed(result)
    assert continued.returncode == 0, continued.stderr[-3000:]
    full_dir = only_run_dir(tmp_path / 'full')
    assert set(snapshots(full_dir)) <= set(snapshots(run_dir))
    for name in snapshots(full_dir):
        assert_same_snapshot(os.path.join(full_dir, name), os.path.join(run_dir, name))


def test_signals_while_the_processes_start_wait_for_them(tmp_path):
    """SIGUSR1 to the two processes that train.py --gpus=2 spawned (and only to them), while they import torch: they
    began with the signal blocked, so it waits for their handler instead of ending them, and the run stops at its
    first G step boundary with a snapshot of step 0."""
    import psutil
    outdir = tmp_path / 'runs'
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
    train = subprocess.Popen([sys.executable, 'train.py', f'--outdir={outdir}', *QUICK, '--gpus=2', '--workers=2'],
                             cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while len(spawned := [p for p in psutil.Process(train.pid).children() if 'spawn_main' in ' '.join(p.cmdline())]) < 2:
            assert train.poll() is None and time.time() < deadline, 'train.py ended or never spawned its processes'
            time.sleep(0.05)
        for process in spawned:
            os.kill(process.pid, signal.SIGUSR1)
        out, err = train.communicate(timeout=600)
    finally:
        train.kill()
    assert train.returncode == REQUEUE_STATUS and 'Traceback' not in out + err, err[-3000:]
    run_dir = only_run_dir(outdir)
    assert f'Stopped by SIGUSR1 after G step 0, snapshot {run_dir}/network-snapshot-000000.pkl;' in out
    assert persistence.load_snapshot(os.path.join(run_dir, 'network-snapshot-000000.pkl')).progress.step == 0
