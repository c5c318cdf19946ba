"""--resume=latest (training/run/run_dirs.py): which run directory and snapshot a requeued job continues, the records
it drops before redoing them, and train.py's lines for it."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.support.stand_ins import write_dataset_zip
from tests.support.tiny_runs import tiny_experiment
from torch_utils import persistence
from training import training_loop
from training.run import run_dirs

pytestmark = pytest.mark.usefixtures('tiny_preset')  # --cfg=tiny (tests/support/tiny_runs.py)


@pytest.fixture
def one_run(tmp_path):
    """A width-2 run of 3 G steps with a snapshot at each ('000000.002', '.004', '.006'): its experiment and folder."""
    write_dataset_zip(str(tmp_path / 'data.zip'), num_images=8, resolution=8)
    experiment = tiny_experiment(str(tmp_path / 'data.zip'), steps=3, batch=2, tick=0.002, snap=1)
    run_dir = tmp_path / 'run'
    run_dir.mkdir()
    training_loop.training_loop(experiment, run_dir=str(run_dir))
    return experiment, run_dir


def _copy_run(source, dest, options=None):
    shutil.copytree(source, dest)
    if options is not None:
        (dest / 'training_options.json').write_text(json.dumps(dict(options.record(), run_desc='x')))


def test_the_newest_matching_run_and_its_newest_complete_snapshot(tmp_path, one_run):
    experiment, source = one_run
    outdir = tmp_path / 'runs'
    outdir.mkdir()
    _copy_run(source, outdir / '00007-match', experiment)
    # Another experiment by its training_options.json: its snapshots are never opened (they are not even snapshots).
    _copy_run(source, outdir / '00008-other-seed', dataclasses.replace(experiment, seed=5))
    for name in os.listdir(outdir / '00008-other-seed'):
        if name.startswith('network-snapshot-'):
            (outdir / '00008-other-seed' / name).write_bytes(b'not a snapshot')
    # Another experiment by its snapshot (no training_options.json).
    _copy_run(source, outdir / '00009-other-in-snapshot')
    newest = outdir / '00009-other-in-snapshot' / 'network-snapshot-000000.006.pkl'
    snapshot = persistence.load_snapshot(str(newest))
    persistence.save_snapshot(str(newest), dict(snapshot, experiment=dict(snapshot.experiment, seed=7)))
    # The newest match: its newest snapshot damaged, a temporary file of a killed writer beside it.
    _copy_run(source, outdir / '00010-damaged', experiment)
    damaged = outdir / '00010-damaged' / 'network-snapshot-000000.006.pkl'
    damaged.write_bytes(damaged.read_bytes()[:1000])
    stale = outdir / '00010-damaged' / '.network-snapshot-000000.008.pkl.4194305.0123abcd.tmp'
    stale.write_bytes(b'partial')

    lines = []
    found = run_dirs.find_latest(str(outdir), experiment, lines.append)
    assert (found.run_dir, found.snapshot_pkl) == (str(outdir / '00010-damaged'),
                                                   str(outdir / '00010-damaged' / 'network-snapshot-000000.004.pkl'))
    assert found.snapshot.progress.step == 2 and not stale.exists()
    assert len(lines) == 1 and lines[0].startswith(f'--resume=latest: passing over {damaged}: ')

    shutil.rmtree(outdir / '00010-damaged')
    lines.clear()
    found = run_dirs.find_latest(str(outdir), experiment, lines.append)
    assert found.snapshot_pkl == str(outdir / '00007-match' / 'network-snapshot-000000.006.pkl') and lines == []
    # The newest run of the experiment ended before its first snapshot: a new run, not the older one.
    (outdir / '00011-no-snapshot').mkdir()
    (outdir / '00011-no-snapshot' / 'training_options.json').write_text(json.dumps(experiment.record()))
    assert run_dirs.find_latest(str(outdir), experiment, lines.append) is None
    assert lines == [f'--resume=latest: {outdir / "00011-no-snapshot"} has no complete snapshot to continue from']
    shutil.rmtree(outdir / '00011-no-snapshot')
    assert run_dirs.find_latest(str(outdir), dataclasses.replace(experiment, seed=9), lines.append) is None
    assert run_dirs.find_latest(str(tmp_path / 'nothing-here'), experiment, lines.append) is None
    lines.clear()
    assert run_dirs.next_run_dir(str(outdir), 'x') == str(outdir / '00010-x')
    (outdir / '123456-y').mkdir()
    assert run_dirs.next_run_dir(str(outdir), 'x') == str(outdir / '123457-x')


def test_records_after_the_snapshot_are_dropped(tmp_path):
    """A run that died after the snapshot of step 3 (6 images) had written ticks 4 and 5, half a line, and the metric
    of a later snapshot."""
    stats = [json.dumps({'Progress/step': {'num': 1, 'mean': float(step), 'std': 0.0}}) + '\n' for step in range(1, 6)]
    (tmp_path / 'stats.jsonl').write_text(''.join(stats) + '{"Progress/st')
    metrics = [json.dumps({'results': {'fid50k_full': 1.0}, 'snapshot_pkl': name}) + '\n'
               for name in ['network-snapshot-000000.004.pkl', 'network-snapshot-000000.006.pkl', 'network-snapshot-000000.010.pkl']]
    (tmp_path / 'metric-fid50k_full.jsonl').write_text(''.join(metrics))
    (tmp_path / 'log.txt').write_text('{"not": "touched"}\n')
    assert run_dirs.drop_records_after(str(tmp_path), step=3, cur_nimg=6) == 2 + 1 + 1
    assert (tmp_path / 'stats.jsonl').read_text() == ''.join(stats[:3])
    assert (tmp_path / 'metric-fid50k_full.jsonl').read_text() == ''.join(metrics[:2])
    assert (tmp_path / 'log.txt').read_text() == '{"not": "touched"}\n'
    assert run_dirs.drop_records_after(str(tmp_path), step=3, cur_nimg=6) == 0


def test_train_py_says_what_latest_continues(tmp_path):
    """In-process train.py: a fresh run of one G step; then --resume=latest (dry run) names its directory and snapshot,
    another seed starts a new run, saying how the newest run differs (an empty --outdir: nothing to say), and
    --resume-override is refused in one line."""
    from click.testing import CliRunner
    import train
    outdir = tmp_path / 'runs'
    common = [f'--outdir={outdir}', '--steps=1', '--batch=4', '--workers=0']
    assert CliRunner().invoke(train.main, common).exit_code == 0
    run_dir = outdir / os.listdir(outdir)[0]
    result = CliRunner().invoke(train.main, [*common, '--steps=2', '--resume=latest', '--dry-run'])
    assert result.exit_code == 0, result.output
    snapshot = run_dir / 'network-snapshot-000000.004.pkl'
    assert f'--resume=latest: continuing {run_dir} from {snapshot}' in result.output
    assert f'"resume_pkl": "{snapshot}"' in result.output
    result = CliRunner().invoke(train.main, [*common, '--seed=1', '--resume=latest', '--dry-run'])
    assert (f'--resume=latest: no run of this experiment in {outdir}; starting one (the newest run there, {run_dir}, '
            f'was trained with other options: --seed=1 (was 0))') in result.output.splitlines()
    empty = tmp_path / 'empty'
    result = CliRunner().invoke(train.main, [f'--outdir={empty}', '--resume=latest', '--dry-run'])
    assert f'--resume=latest: no run of this experiment in {empty}; starting one' in result.output.splitlines()
    result = CliRunner().invoke(train.main, [*common, '--resume=latest', '--resume-override'])
    assert result.exit_code != 0 and result.output.strip().splitlines() == [
        'Error: --resume-override goes with --resume=PKL: --resume=latest continues a run of this very experiment']


def test_a_live_writers_temporary_file_is_no_snapshot(tmp_path, one_run):
    """A snapshot being written: its writer (a live process) has put every byte of the step-3 snapshot into its
    temporary file and not yet renamed it. --resume=latest continues from the newest snapshot in place, leaves the
    writer's file alone, and has nothing to pass over."""
    experiment, source = one_run
    outdir = tmp_path / 'runs'
    outdir.mkdir()
    _copy_run(source, outdir / '00003-run', experiment)
    run_dir = outdir / '00003-run'
    writing = tmp_path / 'network-snapshot-000000.006.pkl'
    os.replace(run_dir / writing.name, writing)
    writer = subprocess.Popen([sys.executable, '-c', 'import os, shutil, sys, time; '
                               'shutil.copy(sys.argv[1], os.path.join(sys.argv[2], f".{os.path.basename(sys.argv[1])}.{os.getpid()}.0123abcd.tmp")); '
                               'print(flush=True); time.sleep(120)', str(writing), str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        writer.stdout.readline()  # Its file is written.
        temporary = run_dir / f'.{writing.name}.{writer.pid}.0123abcd.tmp'
        assert temporary.read_bytes() == writing.read_bytes()
        lines = []
        found = run_dirs.find_latest(str(outdir), experiment, lines.append)
        assert (found.run_dir, found.snapshot_pkl) == (str(run_dir), str(run_dir / 'network-snapshot-000000.004.pkl'))
        assert found.snapshot.progress.step == 2 and lines == []
        assert run_dirs.snapshots_newest_first(str(run_dir)) == [str(run_dir / f'network-snapshot-000000.00{n}.pkl') for n in (4, 2)]
        assert temporary.exists()  # Its writer lives: not removed as a dead writer's would be.
    finally:
        writer.kill()
        writer.wait()
