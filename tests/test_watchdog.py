"""tests/support/watchdog.py: a hung test is reported with its stacks and ended, and the suite goes on."""

import os
import subprocess
import sys
import textwrap
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HUNG_TESTS = '''
import subprocess, sys, threading

def test_waits_for_a_child():
    assert subprocess.run([sys.executable, '-c', 'import time; time.sleep(300)']).returncode == 0

def test_waits_for_a_thread():
    threading.Event().wait()

def test_after():
    pass
'''


def run_pytest(tmp_path, *args) -> tuple[subprocess.CompletedProcess, float]:
    """pytest with the watchdog at 2 s and a grace period of 3 s, on HUNG_TESTS: its result and its seconds."""
    (tmp_path / 'conftest.py').write_text(textwrap.dedent(f'''
        import sys
        sys.path.insert(0, {REPO_ROOT!r})
        from tests.support.watchdog import Watchdog

        def pytest_configure(config):
            config.pluginmanager.register(Watchdog(limit=2, grace=3), 'watchdog')
        '''))
    (tmp_path / 'test_hung.py').write_text(HUNG_TESTS)
    start = time.monotonic()
    result = subprocess.run([sys.executable, '-m', 'pytest', '-p', 'no:cacheprovider', f'--rootdir={tmp_path}',
                             '-c', os.devnull, *args], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    return result, time.monotonic() - start


def test_a_test_waiting_for_a_child_fails_once_its_children_are_killed(tmp_path):
    result, seconds = run_pytest(tmp_path, 'test_hung.py::test_waits_for_a_child', 'test_hung.py::test_after')
    assert result.returncode == 1 and '1 failed, 1 passed' in result.stdout, result.stdout + result.stderr
    assert 'assert -9 == 0' in result.stdout  # SIGKILL
    err = result.stderr
    assert 'test_hung.py::test_waits_for_a_child still runs after 2 s' in err, err
    assert 'line 5 in test_waits_for_a_child' in err  # The stack of the waiting test.
    assert "time.sleep(300)" in err.split('killing child ', 1)[1].splitlines()[0]
    assert 'this process ends' not in err
    assert seconds < 60


def test_a_test_waiting_for_something_else_ends_its_worker_and_the_suite_goes_on(tmp_path):
    result, seconds = run_pytest(tmp_path, '-n', '1', 'test_hung.py::test_waits_for_a_thread', 'test_hung.py::test_after')
    out, err = result.stdout, result.stderr
    assert result.returncode == 1 and '1 failed, 1 passed' in out, out + err
    assert "crashed while running 'test_hung.py::test_waits_for_a_thread'" in out
    assert 'test_hung.py::test_waits_for_a_thread still runs 3 s after its children were killed: this process ends ' \
           '(status 70)' in err, err
    assert 'line 8 in test_waits_for_a_thread' in err
    assert seconds < 90
