"""torch_utils/threads.py: the OpenMP wait policy is set before torch loads, in every program (the start-up,
torch_utils/startup.py), and --threads."""

import ast
import os
import subprocess
import sys

import torch

from tests.support.programs import REPO_ROOT, programs
from torch_utils import threads

# Imports a program as running it would (`-m MODULE`, or a script's path), without its main: at the first import of
# torch it prints OMP_WAIT_POLICY as torch would read it and ends the process, before torch loads.
_AT_TORCH_IMPORT = '''
import importlib, os, runpy, sys
class AtTorchImport:
    def find_spec(self, name, path, target=None):
        if name == 'torch':
            print(os.environ.get('OMP_WAIT_POLICY'), flush=True)
            os._exit(0)
        return None
sys.meta_path.insert(0, AtTorchImport())
if sys.argv[1] == '-m':
    importlib.import_module(sys.argv[2])
else:
    runpy.run_path(sys.argv[1], run_name='imported')
print('torch never imported')
'''


def _policy_at_torch_import(env: dict) -> dict[str, str]:
    """Per program, OMP_WAIT_POLICY at the moment torch is first imported, in a fresh process with `env`."""
    processes = {' '.join(p): subprocess.Popen([sys.executable, '-c', _AT_TORCH_IMPORT, *p], cwd=REPO_ROOT, env=env,
                                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for p in programs()}
    found = {}
    for name, process in processes.items():
        out, err = process.communicate(timeout=300)
        found[name] = out.strip() or err.strip()[-300:]
    return found


def test_every_program_sets_a_passive_wait_policy_before_torch_loads():
    env = {k: v for k, v in os.environ.items() if k != 'OMP_WAIT_POLICY'}
    found = _policy_at_torch_import(env)
    assert len(found) >= 25 and {'generate.py', '-m bench.ops', 'docs/make_configs_md.py'} <= set(found)
    assert found == {name: 'PASSIVE' for name in found}


def test_a_wait_policy_given_in_the_environment_is_kept():
    env = dict(os.environ, OMP_WAIT_POLICY='ACTIVE')
    result = subprocess.run([sys.executable, '-c', _AT_TORCH_IMPORT, 'generate.py'], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == 'ACTIVE', result.stderr


def test_every_program_starts_with_the_start_up():
    """The first import of each program that is not of Python's standard library is `import torch_utils.startup`."""
    wrong = []
    for program in programs():
        path = program[0] if program[0] != '-m' else program[1].replace('.', '/') + '.py'
        with open(os.path.join(REPO_ROOT, path), encoding='utf-8') as f:
            tree = ast.parse(f.read())
        first = next(node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)) and
                     (node.names[0].name if isinstance(node, ast.Import) else node.module).split('.')[0]
                     not in sys.stdlib_module_names | {'__future__'})
        if not (isinstance(first, ast.Import) and [a.name for a in first.names] == ['torch_utils.startup']):
            wrong.append(f'{path}:{first.lineno}: {ast.unparse(first)}')
    assert wrong == []


def test_set_threads():
    before = torch.get_num_threads()
    try:
        threads.set_threads(1)
        assert torch.get_num_threads() == 1
        threads.set_threads(None)
        assert torch.get_num_threads() == 1  # None leaves the count alone.
    finally:
        torch.set_num_threads(before)
