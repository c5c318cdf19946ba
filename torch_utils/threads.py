"""CPU threads of the command-line tools: a wait policy that survives a busy machine, and --threads.

PyTorch runs its CPU kernels on an OpenMP thread pool. By default (libgomp) a thread that runs
out of work spins for a while before it sleeps, which costs nothing on an idle machine and a great
deal on a busy one: the spinning threads take their turns on the cores that the working thread
and the other programs need. OMP_WAIT_POLICY=PASSIVE makes them sleep at once, so that a run on a
busy machine slows down about in proportion to the competing load, not several times over; on an
idle machine it costs a little.

libgomp reads OMP_WAIT_POLICY once, when torch loads it, so every tool calls `set_wait_policy()`
before anything imports torch; a policy the user set in the environment is kept. `--threads`
(`set_threads`) sets torch's intra-op thread count after that.
"""

from __future__ import annotations

import os

#----------------------------------------------------------------------------


def set_wait_policy() -> None:
    """OMP_WAIT_POLICY=PASSIVE unless the environment says otherwise; effective only before torch is imported."""
    os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')


def set_threads(threads: int | None) -> None:
    """torch's intra-op threads (None: torch's default, one per core)."""
    import torch
    if threads is not None:
        torch.set_num_threads(threads)


def contention() -> str | None:
    """'load 3.1 on 2 cores' when more threads want to run than the machine has cores (1-minute load
    average, this process's own threads included), else None. Unix only; None where unknown."""
    cores = os.cpu_count()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    if cores is None or load <= cores + 0.5:
        return None
    return f'load {load:.1f} on {cores} cores'
