"""Stopping a run on a signal: SIGTERM or SIGUSR1 ends it with a snapshot of the G step it finished.

Clusters end jobs with a signal. SLURM sends SIGTERM at the time limit or on preemption, and SIGKILL
KillWait seconds (30 by default) later; a job that asks for it with `--signal=USR1@120` gets SIGUSR1
about two minutes before its time limit. SLURM signals every process of a job step (train.py, the
processes it spawned, their DataLoader workers), and launchers forward what they receive (train.py
--gpus=N to its processes: `forward_signals`; torchrun to its workers), so one request may reach a
process twice within moments.

In a training process, `StopSignal` turns the first SIGTERM or SIGUSR1 into a stop request:

    the handler only records the signal (and its time): the step in progress runs to its end;
    agreed(), called by the training loop at every G step boundary, tells every process the same:
        any process's request stops all of them after the same G step (an all_reduce of the signal
        number, MAX, on a CPU (gloo) group, so that a NCCL run does not synchronize its GPU at every
        step; a single process needs no collective);
    the loop then writes a snapshot and raises RunStopped; train.py says so in one line, with the
        command that continues the run, and exits with EXIT_STOPPED;
    a metric evaluation in progress checks agreed() after every batch (`interrupt`) and is abandoned;
    a further signal more than DUPLICATE_S seconds after the first ends the process at once, by the
        signal's own default action, leaving the last complete snapshot as it is (snapshots are
        written atomically: a write cut short leaves only a temporary file, which a resumed run removes);
        signals within DUPLICATE_S of the first are the same request delivered twice.

A forked process (a DataLoader worker) inherits the handler and ignores the signal: the training
process ends its workers itself, so they print no traceback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Iterator

import torch

#----------------------------------------------------------------------------

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
EXIT_STOPPED = 75       # sysexits.h EX_TEMPFAIL, "try again later": the same command with --resume=latest continues.
DUPLICATE_S = 2.0       # Signals this soon after the first are the same request (scheduler and launcher both deliver it).


class RunStopped(Exception):
    """The run stopped on a signal after G step `step`, with its last snapshot at `snapshot` (None: none written in
    this session, the one it resumed from is the last)."""

    def __init__(self, signal_name: str, step: int, snapshot: str | None) -> None:
        super().__init__(f'stopped by {signal_name} after G step {step}')
        self.signal_name, self.step, self.snapshot = signal_name, step, snapshot


class StopRequested(Exception):
    """Raised by StopSignal.interrupt() inside work that a stop abandons (a metric evaluation)."""


class StopSignal:
    """The stop request of SIGTERM and SIGUSR1 in one training process of `num_gpus` (see the module docstring).
    A context manager: the handlers hold inside it (main thread only, where Python runs signal handlers)."""

    def __init__(self, num_gpus: int) -> None:
        self.num_gpus = num_gpus
        self.signal_name: str | None = None  # The signal that stopped the run, once agreed.
        self._received = 0                   # Signal number received by this process (0: none).
        self._received_at: float | None = None
        self._group = None                   # The CPU group of the agreement (None: the default group).
        self._previous: dict[int, object] = {}
        self._pid = os.getpid()

    def __enter__(self) -> StopSignal:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        if self.num_gpus > 1 and torch.distributed.get_backend() != 'gloo':
            self._group = torch.distributed.new_group(backend='gloo')  # Every process creates it, together.
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)

    def _handle(self, signum: int, _frame) -> None:
        if os.getpid() != self._pid:
            return  # A forked DataLoader worker: the training process ends it.
        now = time.monotonic()
        if self._received_at is None:
            self._received, self._received_at = signum, now
        elif now - self._received_at > DUPLICATE_S:  # A second request: end now, as the signal does by default.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def agreed(self) -> bool:
        """Whether the run stops here: True in every process once any of them has received a stop signal (every
        process calls this at the same points)."""
        if self.signal_name is not None:
            return True
        signum = self._received
        if self.num_gpus > 1:
            flag = torch.tensor([signum], dtype=torch.int32)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self._group)
            signum = int(flag.item())
        if signum:
            self.signal_name = signal.Signals(signum).name
        return self.signal_name is not None

    def interrupt(self) -> None:
        """Raise StopRequested if the run stops: the `interrupt` hook of work the stop abandons (every process
        calls it at the same points)."""
        if self.agreed():
            raise StopRequested(self.signal_name)


@contextlib.contextmanager
def forward_signals(pids: list[int]) -> Iterator[None]:
    """Inside the block, SIGTERM and SIGUSR1 of this process (train.py --gpus=N, which spawned the processes `pids`)
    go on to those processes, each signal as received: they stop after the same G step, or end at once on a second
    signal. This process itself waits for them to end."""
    def forward(signum: int, _frame) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
    previous = {signum: signal.signal(signum, forward) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
