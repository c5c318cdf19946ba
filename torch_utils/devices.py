"""The device a tool runs on, the process group that goes with it, and the process-wide switches of a run.

The device is the user's choice (`--device` on every tool; default: the first GPU when torch sees
one, else the CPU). Everything below the command line receives it as an argument and never asks
`torch.cuda.is_available()` again, so a GPU machine can train, evaluate and test on its CPU.

    --device   --gpus=N   process r uses        process group
    cpu        any        cpu                   gloo
    cuda       N <= GPUs  cuda:r (LOCAL_RANK    nccl
                          under torchrun)
    cuda:K     1          cuda:K                -

Process-wide switches (TF32 matmuls and convolutions, cuDNN's benchmark and deterministic modes,
deterministic algorithms) are set for a run by `run_switches` and restored when it ends, so that a
run inside a larger program (a test, a notebook) leaves the program as it found it. `full_precision`
turns TF32 off for a stretch of work inside a run (metrics: the same numbers on every GPU).
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import torch

#----------------------------------------------------------------------------

CUBLAS_WORKSPACE_ENV = 'CUBLAS_WORKSPACE_CONFIG'
CUBLAS_DETERMINISTIC_WORKSPACE = ':4096:8'  # What cuBLAS needs to be repeatable (CUDA's documentation).


def default_device() -> torch.device:
    """The device of a tool run without --device: the first visible GPU, else the CPU."""
    return torch.device('cuda') if torch.cuda.is_available() else torch.device('cpu')


def parse_device(name: str | None) -> torch.device:
    """The device called `name` ('cpu', 'cuda', 'cuda:N'; None: `default_device()`), or ValueError with a
    one-line reason when torch cannot use it here."""
    if name is None:
        return default_device()
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f'"{name}" is not a device; use cpu, cuda or cuda:N') from None
    if device.type not in ('cpu', 'cuda'):
        raise ValueError(f'use cpu, cuda or cuda:N, not {name}')
    if device.type == 'cuda':
        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= visible:
            raise ValueError(f'{name} is not visible: torch sees {visible} CUDA GPU(s)'
                             f'{"" if torch.cuda.is_available() else " (no CUDA here)"}')
    return device


def check_process_count(device: torch.device, num_processes: int) -> None:
    """ValueError with a one-line reason if `num_processes` processes (one per GPU) cannot run on `device`:
    more GPUs than are visible, or one given GPU (cuda:K) shared by several processes."""
    if device.type != 'cuda' or num_processes == 1:
        return
    if device.index is not None:
        raise ValueError(f'--device={device} names one GPU and --gpus={num_processes} asks for {num_processes}; use '
                         f'--device=cuda (CUDA_VISIBLE_DEVICES chooses which GPUs)')
    visible = torch.cuda.device_count()
    if num_processes > visible:
        raise ValueError(f'--gpus={num_processes}, but torch sees {visible} CUDA GPU(s); use --gpus={visible} or fewer, '
                         f'or --device=cpu')


def process_device(device: torch.device, local_rank: int) -> torch.device:
    """The device of process `local_rank` (its index on this machine) of a run on `device`; for CUDA also made
    the process's current device."""
    if device.type != 'cuda':
        return device
    device = torch.device('cuda', device.index if device.index is not None else local_rank)
    torch.cuda.set_device(device)
    return device


def process_group_backend(device: torch.device) -> str:
    """torch.distributed backend for processes on `device`: NCCL between GPUs, gloo on the CPU."""
    return 'nccl' if device.type == 'cuda' else 'gloo'

#----------------------------------------------------------------------------


def read_switches() -> dict:
    """torch's process-wide switches that a run sets (`run_switches`), by name."""
    return dict(matmul_tf32=torch.backends.cuda.matmul.allow_tf32, cudnn_tf32=torch.backends.cudnn.allow_tf32,
                cudnn_benchmark=torch.backends.cudnn.benchmark, cudnn_deterministic=torch.backends.cudnn.deterministic,
                deterministic=torch.are_deterministic_algorithms_enabled(),
                deterministic_warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
                cublas_workspace=os.environ.get(CUBLAS_WORKSPACE_ENV))


def write_switches(switches: dict) -> None:
    """Set the switches `read_switches` returned."""
    torch.backends.cuda.matmul.allow_tf32 = switches['matmul_tf32']
    torch.backends.cudnn.allow_tf32 = switches['cudnn_tf32']
    torch.backends.cudnn.benchmark = switches['cudnn_benchmark']
    torch.backends.cudnn.deterministic = switches['cudnn_deterministic']
    torch.use_deterministic_algorithms(switches['deterministic'], warn_only=switches['deterministic_warn_only'])
    if switches['cublas_workspace'] is None:
        os.environ.pop(CUBLAS_WORKSPACE_ENV, None)
    else:
        os.environ[CUBLAS_WORKSPACE_ENV] = switches['cublas_workspace']


@contextlib.contextmanager
def run_switches(device: torch.device, allow_tf32: bool, deterministic: bool = False) -> Iterator[None]:
    """The process-wide switches of one run on `device`, restored to what they were when the run ends.

    allow_tf32: may float32 matmuls and convolutions use TF32 tensor cores (no effect on a CPU).
    deterministic: repeatable GPU arithmetic, so that the same seed (or a resumed snapshot) gives the same
    bits: deterministic algorithms (ops without one warn), cuDNN deterministic with benchmarking off, and
    cuBLAS's fixed workspace. Otherwise cuDNN benchmarks its convolution algorithms on CUDA (faster,
    not repeatable). A CPU run is repeatable either way.
    """
    saved = read_switches()
    try:
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
        torch.backends.cudnn.allow_tf32 = allow_tf32
        torch.backends.cudnn.benchmark = device.type == 'cuda' and not deterministic
        torch.backends.cudnn.deterministic = deterministic
        torch.use_deterministic_algorithms(deterministic, warn_only=True)
        if deterministic and device.type == 'cuda':
            os.environ.setdefault(CUBLAS_WORKSPACE_ENV, CUBLAS_DETERMINISTIC_WORKSPACE)
        yield
    finally:
        write_switches(saved)


@contextlib.contextmanager
def full_precision() -> Iterator[None]:
    """float32 matmuls and convolutions at full float32 precision inside (TF32 off, for cuBLAS and cuDNN),
    whatever the run's precision; the switches as they were afterwards, also when the work raises.
    A no-op for the arithmetic on a CPU, where the switches are plain flags."""
    saved = read_switches()
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        yield
    finally:
        write_switches(saved)
