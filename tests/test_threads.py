"""torch_utils/threads.py: the OpenMP wait policy is set before torch loads, and --threads."""

import os
import subprocess
import sys

import torch

from torch_utils import threads

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every program of the repository that loads torch. bench/gpu_report.py and bench/train_speed.py are not listed yet.
TOOLS = ('train.py', 'generate.py', 'calc_metrics.py', 'dataset_tool.py', 'legacy.py', 'bench/compare.py', 'bench/gpu_report.py',
         'bench/hostile_files.py', 'bench/ops.py', 'bench/precision.py', 'bench/quickstart_quality.py', 'bench/stylegan.py',
         'bench/train_speed.py')


def _tool_environment(tool: str, env: dict) -> str:
    """OMP_WAIT_POLICY as torch's process sees it after `tool` (a module of the repository) is imported."""
    code = f'import {tool}, os; print(os.environ.get("OMP_WAIT_POLICY"))'
    result = subprocess.run([sys.executable, '-c', code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                            check=True, timeout=120)
    return result.stdout.strip()


def test_every_tool_sets_a_passive_wait_policy_before_torch_unless_told_otherwise():
    env = {k: v for k, v in os.environ.items() if k != 'OMP_WAIT_POLICY'}
    for tool in TOOLS:
        assert _tool_environment(tool[:-3].replace('/', '.'), env) == 'PASSIVE', tool
    assert _tool_environment('train', dict(env, OMP_WAIT_POLICY='ACTIVE')) == 'ACTIVE'


def test_wait_policy_set_before_torch_in_every_tool():
    """Each tool calls set_wait_policy() before any import that loads torch (libgomp reads the variable when torch
    loads it): run the tool's imports up to that call and check torch is not loaded yet."""
    for tool in TOOLS:
        source = open(os.path.join(REPO_ROOT, tool)).read()
        head = source[:source.index('\nset_wait_policy()')]
        path = os.path.join(REPO_ROOT, tool)
        result = subprocess.run([sys.executable, '-c', f'import sys; exec(compile({head!r}, {tool!r}, "exec"), '
                                 f'{{"__file__": {path!r}}}); print("torch" in sys.modules)'], cwd=REPO_ROOT,
                                capture_output=True, text=True, timeout=120)
        assert result.stdout.strip() == 'False', (tool, result.stderr)


def test_set_threads():
    before = torch.get_num_threads()
    try:
        threads.set_threads(1)
        assert torch.get_num_threads() == 1
        threads.set_threads(None)
        assert torch.get_num_threads() == 1  # None leaves the count alone.
    finally:
        torch.set_num_threads(before)
