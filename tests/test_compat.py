"""torch_utils/compat.py: the oldest supported PyTorch, the one line every program gives on an older one (its
start-up, torch_utils/startup.py), and the differences between supported releases."""

import os
import re
import subprocess
import sys
import time

import pytest
import torch

from tests.support.programs import REPO_ROOT, programs
from torch_utils import compat

OLDEST = '.'.join(map(str, compat.OLDEST_TORCH))


@pytest.mark.parametrize('version, release', [('2.5.1+cu124', (2, 5)), ('2.13.0+cpu', (2, 13)), ('2.6.0a0+git1a2b3c', (2, 6)),
                                              ('2.5.0a0+e000cf0ad9.nv24.10', (2, 5)), ('10.0', (10, 0))])
def test_release_of_a_version(version, release):
    assert compat.release(version) == release


def test_supported_versions():
    assert compat.unsupported_reason(torch.__version__) is None  # The suite's own torch.
    for version in (f'{OLDEST}.0', f'{OLDEST}.0a0+git1234', '2.15.0', '3.0.0'):
        assert compat.unsupported_reason(version) is None, version
    major, minor = compat.OLDEST_TORCH
    older = f'{major}.{minor - 1}.1+cu121'
    assert compat.unsupported_reason(older) == (
        f'PyTorch {older} is too old: this code needs torch {OLDEST} or newer (pip install "torch>={OLDEST}", the build '
        f'for your CUDA driver; requirements.txt)')
    with pytest.raises(ValueError, match='not a torch version'):
        compat.release('nightly')


def test_requirements_and_readme_name_the_oldest_torch():
    requirements = open(os.path.join(REPO_ROOT, 'requirements.txt')).read()
    assert re.findall(r'^torch\b.*$', requirements, re.M) == [f'torch>={OLDEST}']
    readme = open(os.path.join(REPO_ROOT, 'README.md')).read()
    assert f'PyTorch {OLDEST} or newer' in readme

#----------------------------------------------------------------------------
# Every program on a torch older than the oldest supported: one line, exit status 1, nothing written.

# Runs a program as `python PROGRAM ARGS` or `python -m MODULE ARGS` would, with torch reporting VERSION once imported.
_AGED_TORCH = '''
import importlib.machinery, os, runpy, sys
VERSION = sys.argv.pop(1)
class AgedTorch:
    def find_spec(self, name, path, target=None):
        if name != 'torch':
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        exec_module = spec.loader.exec_module
        def exec_aged(module):
            exec_module(module)
            module.__version__ = VERSION
        spec.loader.exec_module = exec_aged
        return spec
sys.meta_path.insert(0, AgedTorch())
if sys.argv[1] == '-m':
    sys.argv = sys.argv[2:]
    sys.path[0] = os.getcwd()
    runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)
else:
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
    runpy.run_path(sys.argv[0], run_name='__main__')
'''

# The arguments of a run that would write under {tmp}, or (docs/make_*.py) only check. The other programs get --help,
# so that one that does not make the start-up prints its help instead of doing any work.
ARGUMENTS = {
    'train.py': ['--outdir={tmp}/runs', '--steps=1'],
    'generate.py': ['--network={tmp}/none.pkl', '--seeds=0', '--outdir={tmp}/out'],
    'calc_metrics.py': ['--network={tmp}/none.pkl', '--metrics=fid50k_full'],
    'dataset_tool.py': ['--source=data/digits32.zip', '--dest={tmp}/digits.zip'],
    'legacy.py': ['--source={tmp}/model.pt', '--cfg=cifar10-resnet', '--dest={tmp}/converted.pkl'],
    'bench.activations': ['--outdir={tmp}/activations'],
    'bench.compare': ['--outdir={tmp}/compare'],
    'bench.dataset_tool_speed': ['--out={tmp}/speed.json'],
    'bench.depth_study': ['--outdir={tmp}/depth'],
    'bench.gpu_report': ['--outdir={tmp}/report'],
    'bench.hostile_files': ['--out={tmp}/hostile.json'],
    'bench.layer_norms': ['--network={tmp}/none.pkl'],
    'bench.nvidia': ['--out={tmp}/nvidia.json'],
    'bench.ops': ['--out={tmp}/ops.json'],
    'bench.paper_speed': ['--out={tmp}/paper-speed.json'],
    'bench.paper_table': ['{tmp}/run', '--out={tmp}/table'],
    'bench.precision': ['--out={tmp}/precision.json'],
    'bench.quickstart_quality': ['--out={tmp}/quality.json'],
    'bench.stylegan': ['--out={tmp}/stylegan.json'],
    'bench.stylegan2': ['--out={tmp}/stylegan2.json'],
    'bench.train_speed': ['--out={tmp}/speed.json'],
    'bench.value_surfaces': ['--outdir={tmp}/surfaces'],
    'docs/make_configs_md.py': ['--check'],
    'docs/make_graph_reads_md.py': ['--check'],
    'docs/make_paper_figures.py': ['--check'],
}


def test_every_program_on_an_older_torch_says_so_in_one_line(tmp_path):
    major, minor = compat.OLDEST_TORCH
    older = f'{major}.{minor - 1}.1'
    runs = [program + [a.format(tmp=tmp_path) for a in ARGUMENTS.get(program[-1], ['--help'])] for program in programs()]
    assert len(runs) >= 25 and set(ARGUMENTS) <= {program[-1] for program in programs()}
    processes = [subprocess.Popen([sys.executable, '-c', _AGED_TORCH, older] + argv, cwd=REPO_ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for argv in runs]
    for argv, process in zip(runs, processes):
        out, err = process.communicate(timeout=300)
        assert (process.returncode, out, err) == (1, '', compat.unsupported_reason(older) + '\n'), argv
    assert os.listdir(tmp_path) == []

#----------------------------------------------------------------------------
# join_processes on a torch whose join has no grace_period (torch 2.5), against the behaviour torch 2.6+ documents.


def _process(index: int, ready_dir: str) -> None:
    open(os.path.join(ready_dir, str(index)), 'w').close()
    if index == 0:  # Fails once every process has started.
        while len(os.listdir(ready_dir)) < 3:
            time.sleep(0.05)
        sys.exit(3)
    time.sleep(0.5 if index == 1 else 600)  # 1 ends by itself within the grace period; 2 never would.


def test_join_without_grace_period_gives_the_others_that_long(tmp_path, monkeypatch):
    monkeypatch.setattr(compat, '_JOIN_HAS_GRACE_PERIOD', False)
    context = torch.multiprocessing.start_processes(_process, args=(str(tmp_path),), nprocs=3, join=False,
                                                    start_method='spawn')
    with pytest.raises(torch.multiprocessing.ProcessExitedException) as raised:
        while not compat.join_processes(context, grace_period=10):
            pass
    assert raised.value.error_index == 0 and raised.value.exit_code == 3
    # Process 1 ended on its own (status 0, not SIGTERM's -15); process 2 was terminated after the grace period.
    assert [p.exitcode for p in context.processes] == [3, 0, -15]

#----------------------------------------------------------------------------
# destroy_process_group: where it destroys a gloo group, that never deadlocks.

ROUNDS = 100


def _rounds_of_groups(rank: int, folder: str) -> None:
    """ROUNDS times: a gloo group of two processes, an all-reduce of a tensor that Python drops as the call returns,
    and compat.destroy_process_group, as the programs end. Where compat leaves the group, the process ends there."""
    torch.set_num_threads(1)
    for done in range(ROUNDS):
        store = f'file://{folder}/store{done}'
        torch.distributed.init_process_group('gloo', init_method=store, rank=rank, world_size=2)
        torch.distributed.all_reduce(torch.ones(1000) * rank)
        destroyed = compat.destroy_process_group()
        with open(os.path.join(folder, f'rounds{rank}'), 'w') as f:
            f.write(str(done + 1))
        if not destroyed:
            os._exit(0)


def test_a_gloo_group_is_destroyed_only_where_that_never_deadlocks(tmp_path):
    """Where compat destroys the group (torch 2.8+), every round ends. Before 2.8 such a loop deadlocks within a few
    rounds (a worker thread of gloo waits for the GIL that the destructor holds; docs/benchmarks.md), and compat
    leaves the group after the first round."""
    context = torch.multiprocessing.start_processes(_rounds_of_groups, args=(str(tmp_path),), nprocs=2, join=False,
                                                    start_method='spawn')
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and any(p.is_alive() for p in context.processes):
        time.sleep(0.1)
    for process in context.processes:
        process.kill()
        process.join()
    expected = ROUNDS if compat.release(torch.__version__) >= (2, 8) else 1
    assert [p.exitcode for p in context.processes] == [0, 0]
    assert [int((tmp_path / f'rounds{rank}').read_text()) for rank in range(2)] == [expected, expected]
