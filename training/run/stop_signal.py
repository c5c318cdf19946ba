"""Stopping a run on a signal: SIGTERM or SIGUSR1 ends it with a snapshot of the G step it finished.

Clusters end jobs with a signal. SLURM sends SIGTERM at the time limit or on preemption, and SIGKILL
KillWait seconds (30 by default) later; a job that asks for it with `--signal=USR1@120` gets SIGUSR1
about two minutes before its time limit. SLURM signals every process of a job step (train.py, the
processes it spawned, their DataLoader workers), and a launcher may forward what it receives
(torchrun to its workers), so one request may reach a process twice within moments.

`StopSignal` turns the first SIGTERM or SIGUSR1 of a process into a stop request:

    the handler only records the signal: the step in progress runs to its end;
    `shared` (memory shared with the processes that train.py --gpus=N spawns) carries a request
        from train.py's own process to its processes, and from any of them to the others, without
        another signal: one that arrives while a process is still starting is not lost;
    agreed(), called by the training loop at every G step boundary, tells every process the same:
        any process's request stops all of them after the same G step (an all_reduce of the signal
        number, MAX, on a CPU (gloo) group, so that a NCCL run does not synchronize its GPU at every
        step; a single process needs no collective);
    the loop then writes a snapshot and raises RunStopped; train.py says so in one line, with the
        command that continues the run, and exits with EXIT_STOPPED;
    a metric evaluation in progress checks agreed() after every batch (`interrupt`) and is abandoned;
    a further signal more than DUPLICATE_S seconds after the first ends the process at once (its
        `processes` first, with SIGKILL), by the signal's own default action, leaving the last complete
        snapshot as it is: snapshots are written atomically, and a write cut short leaves only a
        temporary file, which a resumed run removes. Signals within DUPLICATE_S of the first are the
        same request delivered twice.

A forked process (a DataLoader worker) inherits the handler and ignores the signal: the training
process ends its workers itself, so they print no traceback. The processes that train.py --gpus=N
spawns start with the signals blocked (`blocked()`: a process inherits its parent's mask), so that one
that arrives while they import and set up waits for their handler instead of killing them.
"""

from __future__ import annotations

import contextlib
import multiprocessing.resource_tracker
import os
import signal
import threading
import time
from typing import Any, Iterator

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


def shared_request() -> Any:
    """Memory for StopSignal's `shared`, which train.py hands to the processes it spawns."""
    return torch.multiprocessing.get_context('spawn').RawValue('i', 0)


class StopSignal:
    """The stop request of SIGTERM and SIGUSR1 in a process (see the module docstring). A context manager, which may be
    entered again (train.py holds it for the whole command, the training loop for the run): the handlers hold while it
    is entered, in the main thread only (where Python runs signal handlers)."""

    def __init__(self, shared: Any = None) -> None:
        self.shared = shared                 # shared_request(): the request of any process of the run.
        self.processes: list[int] = []       # Processes that a second signal kills first (those train.py spawned).
        self.signal_name: str | None = None  # The signal that stopped the run, once agreed.
        self._received = 0                   # Signal number received by this process (0: none).
        self._received_at: float | None = None
        self._group = None                   # The CPU group of the agreement, made at the first one.
        self._previous: dict[int, Any] = {}
        self._depth = 0
        self._pid = os.getpid()

    def __enter__(self) -> StopSignal:
        self._depth += 1
        if self._depth == 1 and threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._handle) for signum in STOP_SIGNALS}
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # Those held back (blocked()) arrive now.
        return self

    def __exit__(self, *exc_info) -> None:
        self._depth -= 1
        if self._depth == 0:
            for signum, handler in self._previous.items():
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)
            self._previous = {}

    def _handle(self, signum: int, _frame) -> None:
        if os.getpid() != self._pid:
            return  # A forked DataLoader worker: the training process ends it.
        now = time.monotonic()
        if self._received_at is None:
            self._received, self._received_at = signum, now
            if self.shared is not None and not self.shared.value:
                self.shared.value = signum
        elif now - self._received_at > DUPLICATE_S:  # A second request: end now, as the signal does by default.
            for pid in self.processes:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def requested(self) -> int:
        """The signal number of this process's request, or of the one shared with it (0: none)."""
        return self._received or (self.shared.value if self.shared is not None else 0)

    def agreed(self) -> bool:
        """Whether the run stops here: True in every process of the run (torch.distributed's group) once any of them
        has a request (every process calls this at the same points)."""
        if self.signal_name is not None:
            return True
        signum = self.requested()
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            if self._group is None and torch.distributed.get_backend() != 'gloo':
                self._group = torch.distributed.new_group(backend='gloo')  # Every process makes it, at the same call.
            flag = torch.tensor([signum], dtype=torch.int32)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self._group)
            signum = int(flag.item())
        if signum:
            self.signal_name = signal.Signals(signum).name
        return self.signal_name is not None

    @staticmethod
    @contextlib.contextmanager
    def blocked() -> Iterator[None]:
        """Hold SIGTERM and SIGUSR1 back inside the block (they arrive when it ends): processes started in it begin
        with them blocked, until their StopSignal is entered."""
        multiprocessing.resource_tracker.ensure_running()  # Started inside, it would unblock SIGTERM (CPython's).
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def interrupt(self) -> None:
        """Raise StopRequested if the run stops: the `interrupt` hook of work the stop abandons (every process
        calls it at the same points)."""
        if self.agreed():
            raise StopRequested(self.signal_name)
