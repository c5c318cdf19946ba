"""torch_utils/threads.py: the OpenMP wait policy is set before torch loads, and --threads."""

import os
import subprocess
import sys

import torch

from torch_utils import threads

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every program of the repository that loads torch. bench/gpu_report.py and bench/train_speed.py are not listed yet.
TOOLS = ('train.py', 'generate.py', 'calc_metrics.py', 'dataset_tool.py', 'legacy.py', 'bench/compare.py', 'bench/gpu_report.py',
         'bench/hostile_files.py', 'bench/nvidia.py', 'bench/ops.py', 'bench/precision.py', 'bench/quickstart_quality.py',
         'bench/stylegan.py', 'bench/stylegan2.py', 'bench/train_speed.py')


def _tool_environments(tools: list[str], env: dict) -> list[str]:
    """OMP_WAIT_POLICY as each tool (a module of the repository) leaves it when imported into `env`. One process
    imports them all in turn, each afresh (one tool may import another), with `env`'s value put back before each;
    that each tool sets it before torch loads is test_wait_policy_set_before_torch_in_every_tool's to show."""
    code = ('import importlib, os, sys\n'
            'given = os.environ.get("OMP_WAIT_POLICY")\n'
            'for tool in sys.argv[1:]:\n'
            '    os.environ.pop("OMP_WAIT_POLICY", None)\n'
            '    os.environ.update({} if given is None else {"OMP_WAIT_POLICY": given})\n'
            '    sys.modules.pop(tool, None)\n'
            '    importlib.import_module(tool)\n'
            '    print(os.environ.get("OMP_WAIT_POLICY"))\n')
    result = subprocess.run([sys.executable, '-c', code, *tools], cwd=REPO_ROOT, env=env, capture_output=True,
                            text=True, check=True, timeout=300)
    return result.stdout.split()


def test_every_tool_sets_a_passive_wait_policy_before_torch_unless_told_otherwise():
    env = {k: v for k, v in os.environ.items() if k != 'OMP_WAIT_POLICY'}
    modules = [tool[:-3].replace('/', '.') for tool in TOOLS]
    assert dict(zip(TOOLS, _tool_environments(modules, env))) == {tool: 'PASSIVE' for tool in TOOLS}
    assert _tool_environments(modules, dict(env, OMP_WAIT_POLICY='ACTIVE')) == ['ACTIVE'] * len(TOOLS)


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
