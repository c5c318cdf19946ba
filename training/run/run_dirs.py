"""Run directories in --outdir: numbered when made, and found again by --resume=latest.

A run writes into <outdir>/<number>-<description>/ (`next_run_dir`: one more than the highest number
there), made by `create` with the run's training_options.json. `find_latest` is --resume=latest,
which lets a requeued job rerun its own command line:

    run directories, newest (highest number) first:
        pass over one whose experiment differs from the command's (Experiment.changes, as --resume
            compares them; its training_options.json tells without loading a snapshot)
        in the first that matches, continue from its newest complete snapshot (highest kimg; the
            temporary file of a write cut short is no snapshot); one that cannot be loaded gives way,
            with a line, to the one before it; none there: a fresh run (not an older run's)
    none: a fresh run.

The continued run writes into that directory: log.txt and stats.jsonl go on, snapshots are numbered
on. Records written after the snapshot it continues from (by a run that died between snapshots)
would be written again: `drop_records_after` removes them first, so that nothing counts twice.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Callable

import dnnlib
from torch_utils import persistence
from training.run.run_state import load_resumable

#----------------------------------------------------------------------------

_RUN_DIR = re.compile(r'(\d+)-')
_SNAPSHOT = re.compile(r'network-snapshot-(\d+)(?:\.(\d{3}))?\.pkl')  # The label of run_state.snapshot_label.
_OPTIONS_MAX_BYTES = 1 << 20  # training_options.json is a few kB; anything larger is not one of ours.


def check_outdir(outdir: str) -> None:
    """ValueError with a one-line message for an --outdir that is a file, or a folder (or the nearest existing
    parent) that cannot be written."""
    if os.path.exists(outdir) and not os.path.isdir(outdir):
        raise ValueError(f'--outdir: {outdir} is a file, not a folder')
    existing = os.path.abspath(outdir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f'--outdir: cannot write to {existing}')


def create(run_dir: str, options: dict) -> None:
    """Make the new run directory `run_dir` with training_options.json holding `options`. A write that fails
    (dnnlib.util.WriteError) leaves nothing of the run: the directory is removed again."""
    os.makedirs(run_dir, exist_ok=False)
    try:
        write_options(run_dir, options)
    except dnnlib.util.WriteError:
        os.rmdir(run_dir)
        raise


def write_options(run_dir: str, options: dict) -> None:
    """training_options.json of `run_dir`, written whole or not at all (a continued run's options after a resume
    changed them: its `resumes` say where)."""
    with dnnlib.util.writing(path := os.path.join(run_dir, 'training_options.json')), \
            dnnlib.util.atomic_path(path) as tmp, open(tmp, 'wt') as f:
        json.dump(options, f, indent=2)


def recorded_resumes(run_dir: str) -> list[dict]:
    """The `resumes` that training_options.json of `run_dir` records ([] where there is none to read): each resume that
    changed an option, {'step': G step, 'kimg': ..., 'changes': ['--steps=600 (was 300)', ...]}."""
    options = _read_options(run_dir)
    resumes = options.get('resumes') if isinstance(options, dict) else None
    return [r for r in resumes if isinstance(r, dict)] if isinstance(resumes, list) else []


def _read_options(run_dir: str) -> Any:
    """training_options.json of `run_dir` as JSON (None: no such file, too large, or not JSON)."""
    path = os.path.join(run_dir, 'training_options.json')
    try:
        if os.path.getsize(path) > _OPTIONS_MAX_BYTES:
            return None
        with open(path, 'rt') as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
        raise


def next_run_dir(outdir: str, desc: str) -> str:
    """'<outdir>/<number>-<desc>': the number one more than the highest in `outdir`."""
    numbers = [number for number, _ in _run_dirs(outdir)]
    return os.path.join(outdir, f'{max(numbers, default=-1) + 1:05d}-{desc}')


def _run_dirs(outdir: str) -> list[tuple[int, str]]:
    """(number, path) of the run directories in `outdir`, lowest number first."""
    names = os.listdir(outdir) if os.path.isdir(outdir) else []
    return sorted((int(m.group(1)), os.path.join(outdir, name)) for name in names
                  if (m := _RUN_DIR.match(name)) and os.path.isdir(os.path.join(outdir, name)))


def snapshot_nimg(filename: str) -> int | None:
    """Real images at which network-snapshot-<label>.pkl was written (None: not a snapshot's name)."""
    m = _SNAPSHOT.fullmatch(filename)
    return None if m is None else int(m.group(1)) * 1000 + int(m.group(2) or 0)


def snapshots_newest_first(run_dir: str) -> list[str]:
    """The snapshots of a run directory, latest in the run first (temporary files of writes in progress are not)."""
    found = [(nimg, name) for name in os.listdir(run_dir) if (nimg := snapshot_nimg(name)) is not None]
    return [os.path.join(run_dir, name) for _, name in sorted(found, reverse=True)]


def _recorded_experiment(run_dir: str, experiment_class: type) -> Any:
    """The experiment (an `experiment_class`, training/experiment.py's Experiment) that training_options.json of
    `run_dir` records (None: no such file, or one that does not say)."""
    options = _read_options(run_dir)
    if not isinstance(options, dict):
        return None
    try:
        fields = {field.name for field in dataclasses.fields(experiment_class)}
        return experiment_class.from_snapshot({'experiment': {name: value for name, value in options.items() if name in fields}})
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


@dataclasses.dataclass
class Continuation:
    run_dir: str                # The run directory to continue in...
    snapshot_pkl: str           # ...from this snapshot,
    snapshot: dnnlib.EasyDict   # loaded.


def find_latest(outdir: str, experiment: Any, log: Callable[[str], None]) -> Continuation | None:
    """The run of `experiment` (training/experiment.py's Experiment) that --resume=latest continues, by the rule in the
    module docstring; `log` gets a line for each snapshot passed over."""
    for _, run_dir in reversed(_run_dirs(outdir)):
        recorded = _recorded_experiment(run_dir, type(experiment))
        if recorded is not None and recorded.changes(experiment):
            continue
        persistence.remove_stale_temporaries(run_dir)  # Left by a writer that was killed.
        for path in snapshots_newest_first(run_dir):
            try:
                snapshot = load_resumable(path)
                trained = type(experiment).from_snapshot(snapshot)
            except (OSError, ValueError, TypeError, persistence.UnsafeSnapshotError) as e:
                log(f'--resume=latest: passing over {path}: {dnnlib.util.first_line(e)}')
                continue
            if trained.changes(experiment):
                break  # Another experiment's run.
            return Continuation(run_dir, path, snapshot)
        else:
            if recorded is not None:  # This experiment's newest run, ended before its first complete snapshot.
                log(f'--resume=latest: {run_dir} has no complete snapshot to continue from')
                return None
    return None


def newest_other_run(outdir: str, experiment: Any) -> tuple[str, list[str]] | None:
    """The newest run in `outdir` of another experiment than `experiment` and how its options differ (by its
    training_options.json), for --resume=latest to say why it starts a new run (a default that changed since, say)."""
    for _, run_dir in reversed(_run_dirs(outdir)):
        recorded = _recorded_experiment(run_dir, type(experiment))
        if recorded is not None and (changes := recorded.changes(experiment)):
            return run_dir, changes
    return None


def drop_records_after(run_dir: str, step: int, cur_nimg: int) -> int:
    """Remove from `run_dir` the statistics of G steps after `step` (stats.jsonl) and the metrics of snapshots after
    `cur_nimg` images (metric-*.jsonl), and lines cut short; return how many lines went."""
    def later(name: str, entry: dict) -> bool:
        if name == 'stats.jsonl':
            return entry['Progress/step']['mean'] > step
        nimg = snapshot_nimg(os.path.basename(entry['snapshot_pkl'] or ''))
        return nimg is not None and nimg > cur_nimg

    dropped = 0
    for name in sorted(os.listdir(run_dir)):
        if name != 'stats.jsonl' and not (name.startswith('metric-') and name.endswith('.jsonl')):
            continue
        path = os.path.join(run_dir, name)
        with open(path, 'rt') as f:
            lines = f.readlines()
        kept = []
        for line in lines:
            try:
                if not later(name, json.loads(line)):
                    kept.append(line)
            except (ValueError, KeyError, TypeError):
                pass  # Cut short by a process that was killed while writing it.
        if len(kept) < len(lines):
            with dnnlib.util.writing(path), dnnlib.util.atomic_path(path) as tmp, open(tmp, 'wt') as f:
                f.writelines(kept)
            dropped += len(lines) - len(kept)
    return dropped
