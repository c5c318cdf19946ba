"""train.py, with a signal sent during a G step of the tests' choosing: how tests/test_preemption.py stops a run.

    python tests/support/signal_at_step.py <train.py options>

runs train.py's command line. The environment chooses the signal (none when SIGNAL_AT_STEP is not set, so
that the command a stopped run prints, which names this script, continues it as train.py would):

    SIGNAL_AT_STEP      the G step of this session (counted from 1) during which process 0 sends it
    SIGNAL_NAME         SIGTERM (default) or SIGUSR1
    SIGNAL_TO           'self': process 0 itself; 'parent': the process that spawned it (train.py --gpus=N,
                        which passes it on); 'group': its whole process group, twice in a row (as a scheduler
                        signals every process of a job and a launcher forwards it again)
    SECOND_SIGNAL       when set, process 0 sends itself the signal again while it writes the snapshot of
                        the stop, after the file's bytes are written and before it is renamed into place,
                        DUPLICATE_S seconds after the first: the run must end at once

The patches sit at this module's top level, so that the processes that train.py --gpus=N spawns (which import
it as their main module) carry them too.
"""

import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # The repository.

import torch  # noqa: E402

import train  # noqa: E402
from training.run.stop_signal import DUPLICATE_S  # noqa: E402
from training.step.updater import NetworkUpdater  # noqa: E402

SIGNAL_AT_STEP = int(os.environ.get('SIGNAL_AT_STEP', 0))
SIGNUM = getattr(signal, os.environ.get('SIGNAL_NAME', 'SIGTERM'))
_steps = 0
_first_sent_at = None


def _process_zero() -> bool:
    return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0


def _update_ema(self, *args, **kwargs):
    """NetworkUpdater.update_ema, which ends every G step: the signal goes out during step SIGNAL_AT_STEP."""
    global _steps, _first_sent_at
    _steps += 1
    if _steps == SIGNAL_AT_STEP and _process_zero():
        to = os.environ.get('SIGNAL_TO', 'self')
        _first_sent_at = time.monotonic()
        if to == 'group':
            os.killpg(os.getpgrp(), SIGNUM)
            os.killpg(os.getpgrp(), SIGNUM)
        else:
            os.kill(os.getppid() if to == 'parent' else os.getpid(), SIGNUM)
    return _update_ema.original(self, *args, **kwargs)


def _fsync(fd):
    """os.fsync as persistence.save_snapshot calls it, after the bytes and before the rename: the second signal."""
    _fsync.original(fd)
    if _first_sent_at is not None:
        time.sleep(max(0.0, _first_sent_at + DUPLICATE_S + 0.5 - time.monotonic()))
        os.kill(os.getpid(), SIGNUM)
        time.sleep(10)  # The signal ends the process before this does.


if SIGNAL_AT_STEP:
    _update_ema.original = NetworkUpdater.update_ema
    NetworkUpdater.update_ema = _update_ema
if os.environ.get('SECOND_SIGNAL'):
    _fsync.original, os.fsync = os.fsync, _fsync

if __name__ == '__main__':
    train.main()
