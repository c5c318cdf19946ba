"""training/run/stop_signal.py: one request from a signal and its copies, shared with the processes train.py spawns,
ignored by forked DataLoader workers, and a second signal that ends the process at once. The signals go to a
process of its own (a second one would end pytest)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

from training.run.stop_signal import DUPLICATE_S, StopSignal, shared_request

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent(f"""
    import os, signal, sys, time
    sys.path.insert(0, {REPO_ROOT!r})
    from training.run.stop_signal import StopSignal, shared_request
    stop = StopSignal(shared_request())
    spawned = StopSignal(stop.shared)  # A process train.py spawned, with the memory it shares.
    before = signal.getsignal(signal.SIGTERM)
    with stop:
        with stop:  # Entered again (train.py, then the training loop): the same handlers, kept until the outer exit.
            print('before', stop.agreed(), spawned.agreed(), flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGUSR1)  # A scheduler's copy and a launcher's, moments apart: one request.
            print('after', stop.agreed(), stop.signal_name, spawned.agreed(), spawned.signal_name, flush=True)
        print('kept', signal.getsignal(signal.SIGTERM) != before, flush=True)
    print('restored', signal.getsignal(signal.SIGTERM) == before, flush=True)
    with stop:
        time.sleep({DUPLICATE_S} + 0.5)
        os.kill(os.getpid(), signal.SIGUSR1)  # A second request: the end.
        time.sleep(5)
        print('still alive', flush=True)
""")


def test_one_request_shared_then_a_second_one_ends_the_process():
    result = subprocess.run([sys.executable, '-c', SCRIPT], capture_output=True, text=True, timeout=120)
    assert result.stdout.splitlines() == ['before False False', 'after True SIGTERM True SIGTERM', 'kept True',
                                          'restored True']
    assert result.returncode == -signal.SIGUSR1, result.stderr


def test_a_forked_worker_ignores_the_signal():
    """A DataLoader worker is forked with the handler: the signal that a scheduler sends it leaves it running (the
    training process ends it), and leaves the training process's request as it was."""
    stop = StopSignal(shared_request())
    with stop:
        pid = os.fork()
        if pid == 0:  # The worker: sleeps through the signal, then ends by itself.
            time.sleep(2)
            os._exit(0 if stop.requested() == 0 else 3)
        time.sleep(0.5)
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert stop.requested() == 0 and stop.shared.value == 0
