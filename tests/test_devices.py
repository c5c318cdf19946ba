"""torch_utils/devices.py: the device a tool runs on, its process group, and the run's process-wide switches.

What torch reports about CUDA is stubbed, so that the choices a GPU machine makes are tested on a CPU.
"""

import os

import pytest
import torch

from torch_utils import devices


@pytest.fixture
def visible_gpus(monkeypatch):
    """Make torch report `n` CUDA GPUs (set_device recorded, not performed)."""
    selected = []

    def stub(n):
        monkeypatch.setattr(torch.cuda, 'is_available', lambda: n > 0)
        monkeypatch.setattr(torch.cuda, 'device_count', lambda: n)
        monkeypatch.setattr(torch.cuda, 'set_device', lambda device: selected.append(torch.device(device)))
        return selected
    return stub


def test_default_is_the_gpu_when_torch_sees_one(visible_gpus, monkeypatch):
    monkeypatch.undo()  # The suite pins default_device to the CPU; here it is what is tested.
    visible_gpus(0)
    assert devices.parse_device(None) == torch.device('cpu')
    visible_gpus(2)
    assert devices.parse_device(None) == torch.device('cuda')
    assert devices.parse_device('cpu') == torch.device('cpu')  # A GPU machine can still run on its CPU.
    assert devices.parse_device('cuda:1') == torch.device('cuda', 1)


@pytest.mark.parametrize('gpus,name,message', [
    (0, 'cuda', 'cuda is not visible: torch sees 0 CUDA GPU(s) (no CUDA here)'),
    (1, 'cuda:1', 'cuda:1 is not visible: torch sees 1 CUDA GPU(s)'),
    (1, 'mps', 'use cpu, cuda or cuda:N, not mps'),
    (1, 'gpu0', '"gpu0" is not a device; use cpu, cuda or cuda:N'),
])
def test_unusable_devices_are_refused_in_one_line(visible_gpus, gpus, name, message):
    visible_gpus(gpus)
    with pytest.raises(ValueError) as info:
        devices.parse_device(name)
    assert str(info.value) == message


def test_process_count_against_the_visible_gpus(visible_gpus):
    visible_gpus(1)
    devices.check_process_count(torch.device('cpu'), 8)  # CPU processes: as many as asked.
    devices.check_process_count(torch.device('cuda'), 1)
    devices.check_process_count(torch.device('cuda', 0), 1)
    with pytest.raises(ValueError, match=r'^--gpus=2, but torch sees 1 CUDA GPU\(s\); use --gpus=1 or fewer, or --device=cpu$'):
        devices.check_process_count(torch.device('cuda'), 2)
    visible_gpus(4)
    devices.check_process_count(torch.device('cuda'), 4)
    with pytest.raises(ValueError, match='names one GPU'):
        devices.check_process_count(torch.device('cuda', 1), 2)


def test_each_process_takes_its_gpu_and_cpu_processes_use_gloo(visible_gpus):
    selected = visible_gpus(4)
    assert devices.process_device(torch.device('cuda'), 3) == torch.device('cuda', 3)
    assert devices.process_device(torch.device('cuda', 2), 0) == torch.device('cuda', 2)
    assert selected == [torch.device('cuda', 3), torch.device('cuda', 2)]
    assert devices.process_device(torch.device('cpu'), 3) == torch.device('cpu') and len(selected) == 2
    assert devices.process_group_backend(torch.device('cpu')) == 'gloo'  # Whatever is visible.
    assert devices.process_group_backend(torch.device('cuda', 1)) == 'nccl'


@pytest.mark.parametrize('device', ['cpu', 'cuda'])
@pytest.mark.parametrize('deterministic', [False, True])
def test_run_switches_are_set_for_the_run_and_restored(device, deterministic, monkeypatch, switches):
    monkeypatch.delenv(devices.CUBLAS_WORKSPACE_ENV, raising=False)
    switches(cudnn_benchmark=False)
    before = devices.read_switches()
    with devices.run_switches(torch.device(device), allow_tf32=False, deterministic=deterministic):
        inside = devices.read_switches()
    assert devices.read_switches() == before
    assert inside == dict(matmul_tf32=False, cudnn_tf32=False, cudnn_benchmark=device == 'cuda' and not deterministic,
                          cudnn_deterministic=deterministic, deterministic=deterministic,
                          deterministic_warn_only=True,
                          cublas_workspace=':4096:8' if deterministic and device == 'cuda' else None)


def test_run_switches_are_restored_when_the_run_fails(monkeypatch, switches):
    monkeypatch.setenv(devices.CUBLAS_WORKSPACE_ENV, ':16:8')  # The user's own choice is kept, and restored.
    switches(matmul_tf32=False)
    before = devices.read_switches()
    with pytest.raises(RuntimeError, match='diverged'):
        with devices.run_switches(torch.device('cuda'), allow_tf32=True, deterministic=True):
            assert os.environ[devices.CUBLAS_WORKSPACE_ENV] == ':16:8'
            assert torch.backends.cuda.matmul.allow_tf32 and torch.are_deterministic_algorithms_enabled()
            raise RuntimeError('diverged')
    assert devices.read_switches() == before
