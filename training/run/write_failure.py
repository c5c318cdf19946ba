"""A run that cannot write one of its files (a full disk, a quota, a read-only file system) ends in one line.

Every writer of a run turns the OSError into dnnlib.util.WriteError, which names its file, and leaves nothing
partial behind:

    network-snapshot-*.pkl, network-best.pkl    run_state.RunState.save (written whole: a temporary file, renamed)
    reals.png, fakes*.png, progress.png         reporter.ImageGrids, reporter.TickReporter (written whole)
    stats.jsonl, metric-*.jsonl                 reporter.TickReporter, evaluation.MetricEvaluator (a line appended,
                                                cut back if it cannot be written whole: dnnlib.util.append_text)
    log.txt                                     dnnlib.util.Logger (whole lines; the console goes on without it)
    training_options.json                       run_dirs.create (written whole, before the run directory is used)

At a snapshot, an image grid or a metric's record that cannot be written waits (`Deferred`) until the snapshot has
been written and the tick's statistics recorded: it does not cost the run the snapshot that could be written. Then
train.py prints `explain()`: what could not be written, the newest complete snapshot, and the command that
continues the run (--resume=latest) once there is space; exit status 1 (a signal's stop is EXIT_STOPPED, 75).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
from typing import Iterator

from dnnlib.util import WriteError
from training.run.run_dirs import snapshots_newest_first

#----------------------------------------------------------------------------


class Deferred:
    """The first WriteError of the blocks it guards, raised when asked (after the snapshot)."""

    def __init__(self) -> None:
        self.error: WriteError | None = None

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        try:
            yield
        except WriteError as e:
            self.error = self.error or e

    def raise_error(self) -> None:
        error, self.error = self.error, None
        if error is not None:
            raise error


def explain(error: WriteError, run_dir: str | None, continue_args: list[str]) -> str:
    """The one line of a run ended by `error`: the file, the newest complete snapshot in `run_dir` (None: the run
    directory was not made), and `continue_args` (the command line, without --resume) with --resume=latest."""
    snapshots = snapshots_newest_first(run_dir) if run_dir is not None and os.path.isdir(run_dir) else []
    newest = f'the newest complete snapshot is {snapshots[0]}' if snapshots else 'there is no complete snapshot yet'
    when = 'once there is space' if error.errno in (errno.ENOSPC, errno.EDQUOT) else \
        f'once {os.path.dirname(error.filename) or "."} can be written'
    command = f'{continue_args[0]} {shlex.join(continue_args[1:] + ["--resume=latest"])}'
    return f'{error}; {newest}; {when}, {"continue" if snapshots else "start"} with: {command}'
