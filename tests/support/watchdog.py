"""A watchdog over every test (a pytest plugin, registered by tests/conftest.py): a test still running after
GNGAN_TEST_TIME_LIMIT seconds (default 900, far beyond any test's time) is taken as hung.

It prints, on the stderr that pytest found (not a test's captured one, so a CI log shows it), the test's name, the
stacks of every thread of its process, and the child processes it kills: a test that waits for a child (a
subprocess, spawned workers) then fails as any other would. A test still running GRACE_S seconds later waits for
something else (a thread, a lock), and its process ends with status 70: under pytest-xdist the worker is replaced
and the suite goes on, without it the run ends. Either way the suite ends, with the stacks, instead of running
into CI's time limit with nothing said.
"""

from __future__ import annotations

import faulthandler
import os
import threading

import psutil
import pytest

GRACE_S = 60.0
EXIT_HUNG = 70


class Watchdog:
    """The plugin: `limit` seconds for each test, then `grace` seconds more once its children are killed."""

    def __init__(self, limit: float, grace: float = GRACE_S) -> None:
        self.limit = limit
        self.grace = grace
        self.stderr = os.dup(2)  # Taken at pytest_configure, while no output is captured.

    @classmethod
    def from_environment(cls) -> Watchdog:
        return cls(float(os.environ.get('GNGAN_TEST_TIME_LIMIT', '900')))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        done = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(item.nodeid, done), name='test watchdog', daemon=True)
        watcher.start()
        try:
            yield
        finally:
            done.set()
            watcher.join()

    def _say(self, text: str) -> None:
        os.write(self.stderr, f'\n[watchdog, pid {os.getpid()}] {text}\n'.encode())

    def _watch(self, nodeid: str, done: threading.Event) -> None:
        if done.wait(self.limit):
            return
        self._say(f'{nodeid} still runs after {self.limit:g} s: the stacks of its threads, then its children killed')
        faulthandler.dump_traceback(file=self.stderr, all_threads=True)
        for child in psutil.Process().children(recursive=True):
            try:
                self._say(f'killing child {child.pid}: {" ".join(child.cmdline())}')
                child.kill()
            except psutil.Error:
                pass  # Ended meanwhile.
        if done.wait(self.grace):
            return
        self._say(f'{nodeid} still runs {self.grace:g} s after its children were killed: this process ends '
                  f'(status {EXIT_HUNG})')
        faulthandler.dump_traceback(file=self.stderr, all_threads=True)
        os._exit(EXIT_HUNG)
