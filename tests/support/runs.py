"""The tests' runs of the programs as a user runs them (`python SCRIPT ARGS`, in processes of their own, from the
repository's root), and what they leave in a run directory."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.programs import REPO_ROOT


def run_clis(*commands: list[str], check: bool = True, env: dict | None = None) -> list[subprocess.CompletedProcess]:
    """Each command (the arguments of one `python ...`) in its own process and process group, all at once, as a user
    would start them from several shells; their CompletedProcess results, in order. Commands that do not depend on
    each other run together so that a test uses the cores it would otherwise leave idle. `check`: an exit status
    other than 0 fails the test, with the command's output. `env`: variables added to the environment."""
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1', **(env or {}))
    processes = [subprocess.Popen([sys.executable, *args], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True) for args in commands]
    try:
        outputs = [process.communicate(timeout=600) for process in processes]
    finally:
        for process in processes:
            process.kill()
    results = [subprocess.CompletedProcess(p.args, p.returncode, *output) for p, output in zip(processes, outputs)]
    for args, result in zip(commands, results):
        if check and result.returncode != 0:
            raise AssertionError(f'{args[0]} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}')
    return results


def run_cli(*args: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    """One command: `python ARGS` (run_clis)."""
    return run_clis(list(args), check=check, env=env)[0]


def run_train(*args: str, script: str = 'train.py', env: dict | None = None,
              check: bool = False) -> subprocess.CompletedProcess:
    """`python SCRIPT ARGS`: train.py, or a test's wrapper of it (tests/support/signal_at_step.py, full_disk.py);
    its result whatever its exit status, unless `check`."""
    return run_clis([script, *args], check=check, env=env)[0]


def only_run_dir(outdir: str) -> str:
    """The one run directory in `outdir` (the test fails if there are others, or none)."""
    dirs = sorted(os.listdir(outdir))
    assert len(dirs) == 1, dirs
    return os.path.join(outdir, dirs[0])


def snapshots(run_dir: str) -> list[str]:
    """The names of the snapshots in `run_dir`, oldest first."""
    return sorted(f for f in os.listdir(run_dir) if f.startswith('network-snapshot-'))
