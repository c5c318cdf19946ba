"""A full disk during a run (training/run/write_failure.py): every writer of a run fails in one line, leaves nothing
partial, keeps the snapshot that could be written, and --resume=latest then ends with the same snapshots as a run
that never stopped.

The disk fills up by tests/support/full_disk.py: writes to the chosen file write half their bytes, then fail with ENOSPC.
In-process (training/training_loop.py, width-2 networks) for each writer of the loop; as a user runs it (train.py in
a process) for the one line, the exit status, log.txt, training_options.json and the printed command that continues.
"""

import errno
import functools
import json
import os
import shlex

import PIL.Image
import pytest

from dnnlib.util import WriteError
from tests.support import full_disk, runs
from tests.support.runs import snapshots
from tests.support.stand_ins import make_detector, write_dataset_zip
from tests.support.tiny_runs import assert_same_snapshot, tiny_experiment
from torch_utils import persistence
from training import training_loop
from training.run import run_dirs

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.usefixtures('tiny_preset')  # --cfg=tiny (tests/support/tiny_runs.py)

#----------------------------------------------------------------------------
# In-process: ticks of 2 G steps, snapshots every 2 ticks (steps 4, 8, 12: kimg .008, .016, .024).

WRITERS = {  # writer: (files that fail, writes to them that succeed first, the file the error names, newest snapshot kept)
    'snapshot': ('network-snapshot-000000.016', 0, 'network-snapshot-000000.016.pkl', '000000.008'),
    'best snapshot': ('network-best', 0, 'network-best.pkl', '000000.008'),  # Written after the kimg snapshot.
    'image grid': ('fakes000000.016', 0, 'fakes000000.016.png', '000000.016'),
    'stats.jsonl': ('stats.jsonl', 2, 'stats.jsonl', '000000.008'),
    'chart': ('progress.png', 1, 'progress.png', '000000.016'),
    'metric result': ('metric-fid50k_full', 1, 'metric-fid50k_full.jsonl', '000000.016'),
}
WITH_METRICS = ('best snapshot', 'metric result')


def _experiment(tmp_path, monkeypatch, metrics: bool):
    write_dataset_zip(str(tmp_path / 'data.zip'), num_images=12, resolution=8)
    if not metrics:
        return tiny_experiment(str(tmp_path / 'data.zip'), steps=12, batch=2, tick=0.004, snap=2)
    from metrics import metric_main
    monkeypatch.setattr(metric_main, 'calc_metric', functools.partial(metric_main.calc_metric, num_gen=16, max_real=12))
    make_detector(str(tmp_path / 'detector.pt'))
    return tiny_experiment(str(tmp_path / 'data.zip'), steps=12, batch=2, tick=0.004, snap=2, metrics=('fid50k_full',),
                            best_metric='fid50k_full', detector=str(tmp_path / 'detector.pt'))


def assert_nothing_partial(run_dir):
    """No temporary file; every line of every .jsonl whole; every snapshot and picture readable."""
    for name in os.listdir(run_dir):
        path = os.path.join(run_dir, name)
        assert not name.startswith('.'), name
        if name.endswith('.jsonl'):
            text = open(path).read()
            assert text.endswith('\n') or not text, name
            for line in text.splitlines():
                json.loads(line)
        elif name.endswith('.pkl'):
            persistence.load_snapshot(path)
        elif name.endswith('.png'):
            with PIL.Image.open(path) as image:
                image.load()


@pytest.mark.parametrize('writer', list(WRITERS))
def test_a_full_disk_keeps_what_could_be_written_and_resume_ends_the_same(tmp_path, monkeypatch, writer):
    pattern, after, named, kept = WRITERS[writer]
    experiment = _experiment(tmp_path, monkeypatch, writer in WITH_METRICS)
    full, failed = tmp_path / 'full', tmp_path / 'failed'
    full.mkdir()
    failed.mkdir()
    # Each run computes the dataset's statistics once, in its own cache (a cached copy would leave the random
    # streams where computing them does not).
    monkeypatch.setenv('GNGAN_CACHE_DIR', str(tmp_path / 'cache-full'))
    training_loop.training_loop(experiment, run_dir=str(full))
    monkeypatch.setenv('GNGAN_CACHE_DIR', str(tmp_path / 'cache-failed'))
    with monkeypatch.context() as patch:
        disk = full_disk.fill(patch.setattr, pattern, after)
        with pytest.raises(WriteError) as error:
            training_loop.training_loop(experiment, run_dir=str(failed))
    assert disk.writes > after  # The failure was the disk's.
    assert error.value.errno == errno.ENOSPC and error.value.filename == str(failed / named)
    assert str(error.value) == f'cannot write {failed / named}: No space left on device'
    assert_nothing_partial(failed)
    newest = run_dirs.snapshots_newest_first(str(failed))[0]
    assert newest == str(failed / f'network-snapshot-{kept}.pkl')
    assert_same_snapshot(full / os.path.basename(newest), newest)  # What was written is what should have been.

    training_loop.training_loop(experiment, run_dir=str(failed), resume=persistence.load_snapshot(newest))
    assert snapshots(failed) == snapshots(full)
    for name in snapshots(full):
        assert_same_snapshot(full / name, failed / name)
    assert_nothing_partial(failed)

#----------------------------------------------------------------------------
# As a user runs it: train.py, one line and its exit status.

QUICK = ['--steps=6', '--batch=4', '--tick=0.008', '--snap=1']  # The digits; a snapshot every 2 G steps.
run_train = functools.partial(runs.run_train, script='tests/support/full_disk.py')  # train.py on a disk that fills up.


def error_line(result) -> str:
    """The one line of a failed run (on the console: log.txt's Logger sends stderr there too), its exit status 1."""
    console = result.stdout + result.stderr
    lines = [line for line in console.splitlines() if line.startswith('Error: ')]
    assert result.returncode == 1, console[-3000:]  # Neither success nor a signal's stop (75: requeue and go on).
    assert 'Traceback' not in console and len(lines) == 1 and result.stderr.strip() in ('', lines[0]), console[-3000:]
    return lines[0]


def test_train_py_says_what_and_continues_to_the_same_snapshots(tmp_path):
    """The second snapshot does not fit: one line naming it, the first snapshot and the command; that command, once
    there is space, ends with the snapshots of a run that never stopped."""
    outdir = tmp_path / 'runs'
    result = run_train(f'--outdir={outdir}', *QUICK, env=dict(FULL_DISK_FILES='network-snapshot-000000.016'))
    (run_dir,) = [os.path.join(outdir, name) for name in os.listdir(outdir)]
    line = error_line(result)
    command = f'python tests/support/full_disk.py {shlex.join([f"--outdir={outdir}", *QUICK, "--resume=latest"])}'
    assert line == (f'Error: cannot write {run_dir}/network-snapshot-000000.016.pkl: No space left on device; the newest complete '
                    f'snapshot is {run_dir}/network-snapshot-000000.008.pkl; once there is space, continue with: {command}')
    assert_nothing_partial(run_dir)
    assert line in open(os.path.join(run_dir, 'log.txt')).read()

    continued = run_train(*shlex.split(line.split('continue with: ', 1)[1])[2:])
    assert continued.returncode == 0, continued.stderr[-3000:]
    uninterrupted = tmp_path / 'uninterrupted'
    assert run_train(f'--outdir={uninterrupted}', *QUICK, script='train.py').returncode == 0
    (reference,) = [os.path.join(uninterrupted, name) for name in os.listdir(uninterrupted)]
    assert snapshots(run_dir) == snapshots(reference) == [f'network-snapshot-000000.{kimg:03d}.pkl' for kimg in (8, 16, 24)]
    for name in snapshots(reference):
        assert_same_snapshot(os.path.join(reference, name), os.path.join(run_dir, name))


def test_log_txt_full(tmp_path):
    """log.txt cannot take a line: the console still gets everything, the error line included; log.txt keeps whole
    lines only."""
    outdir = tmp_path / 'runs'
    result = run_train(f'--outdir={outdir}', *QUICK, env=dict(FULL_DISK_FILES='log.txt', FULL_DISK_AFTER='3'))
    (run_dir,) = [os.path.join(outdir, name) for name in os.listdir(outdir)]
    line = error_line(result)
    assert line.startswith(f'Error: cannot write {run_dir}/log.txt: No space left on device; there is no complete snapshot yet; '
                           f'once there is space, start with: python tests/support/full_disk.py ')
    log = open(os.path.join(run_dir, 'log.txt')).read().splitlines()
    console = result.stdout.splitlines()
    start = console.index(log[0])
    assert len(log) == 3 and console[start:start + 3] == log  # Whole lines: three writes, three lines.
    assert line in console[start + 3:]
    assert_nothing_partial(run_dir)


def test_training_options_json_full(tmp_path):
    """The first file of a run cannot be written: one line, and no run directory is left."""
    outdir = tmp_path / 'runs'
    outdir.mkdir()
    result = run_train(f'--outdir={outdir}', *QUICK, env=dict(FULL_DISK_FILES='training_options.json'))
    line = error_line(result)
    assert line.startswith('Error: cannot write ') and line.split(': ', 2)[1].endswith('/training_options.json')
    assert 'there is no complete snapshot yet' in line and os.listdir(outdir) == []


def test_two_processes_end_in_one_line(tmp_path):
    """--gpus=2 (gloo on a CPU): process 0 cannot write the second snapshot; the run ends, both processes, in one line."""
    outdir = tmp_path / 'runs'
    result = run_train(f'--outdir={outdir}', *QUICK, '--gpus=2', env=dict(FULL_DISK_FILES='network-snapshot-000000.016'))
    (run_dir,) = [os.path.join(outdir, name) for name in os.listdir(outdir)]
    line = error_line(result)
    assert line.startswith(f'Error: cannot write {run_dir}/network-snapshot-000000.016.pkl: No space left on device; the newest '
                           f'complete snapshot is {run_dir}/network-snapshot-000000.008.pkl; once there is space, continue with: ')
    assert line.endswith(' --gpus=2 --resume=latest')
    assert_nothing_partial(run_dir)
