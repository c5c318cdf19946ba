"""Small helpers: shape assertions, seeding, image grids, and the bits of torch.distributed the training loop needs."""

from __future__ import annotations

import random
import warnings
from typing import Callable, Iterable, Sequence

import numpy as np
import PIL.Image
import torch

import dnnlib

#----------------------------------------------------------------------------


def assert_shape(tensor: torch.Tensor, ref_shape: Sequence[int | None]) -> None:
    """Raise AssertionError unless `tensor` has `ref_shape` (None entries match any size)."""
    if tensor.ndim != len(ref_shape):
        raise AssertionError(f'Wrong number of dimensions: got {tensor.ndim}, expected {len(ref_shape)}')
    for idx, (size, ref_size) in enumerate(zip(tensor.shape, ref_shape)):
        if ref_size is not None and size != ref_size:
            raise AssertionError(f'Wrong size for dimension {idx}: got {size}, expected {ref_size}')


def set_seed(seed: int) -> None:
    """Seed Python, numpy and torch (all devices) in one call."""
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)

#----------------------------------------------------------------------------
# The host and the device.

# ATen operators that read a tensor's values on the host (a scalar read, a comparison to a bool) or whose output's size
# depends on them: on a GPU each makes the host wait for the device, which a CUDA graph capture cannot hold.
HOST_READ_OPS = ('_local_scalar_dense', 'equal', 'is_nonzero', 'allclose', 'nonzero', 'masked_select', '_unique2',
                 'unique_dim', 'unique_consecutive', 'repeat_interleave.Tensor')


def cuda_syncs_of(fn: Callable[[], object]) -> list[str]:
    """fn() with CUDA's synchronisation watch on (torch.cuda.set_sync_debug_mode): where (file:line of the Python that
    called it) each operation that made the host wait for the GPU happened. The watch reports them as warnings; the
    others pass through."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        torch.cuda.set_sync_debug_mode('warn')
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    syncs = []
    for w in caught:
        if 'synchroniz' in str(w.message):
            syncs.append(f'{w.filename}:{w.lineno}')
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return syncs


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`, without making the host wait: to a GPU it is copied asynchronously from pinned memory
    (a copy from pageable memory waits until the stream reaches it). PyTorch's pinned-memory allocator reuses the
    pinned block only once the copy is done."""
    if device.type == 'cpu':
        return x
    return x.pin_memory().to(device, non_blocking=True)


#----------------------------------------------------------------------------
# torch.distributed helpers. All of them are no-ops in a single process.


def world_size() -> int:
    return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1


def rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def broadcast_module(module: torch.nn.Module, src: int = 0) -> None:
    """Copy parameters and buffers of `module` from process `src` to every other process."""
    if world_size() == 1:
        return
    for tensor in list(module.parameters()) + list(module.buffers()):
        torch.distributed.broadcast(tensor.data, src=src)


def all_reduce_mean_grads(params: Iterable[torch.nn.Parameter]) -> None:
    """Average the gradients of `params` across processes, as DDP would, in one flat all-reduce.

    The training loop uses this instead of DistributedDataParallel because the GN discriminator
    step back-propagates through a gradient (double backward), which DDP's reducer does not
    follow reliably, and because G and D take turns being trained.
    """
    n = world_size()
    params = [p for p in params if p.grad is not None]
    if n == 1 or not params:
        return
    flat = torch.cat([p.grad.flatten() for p in params])
    torch.distributed.all_reduce(flat)
    flat /= n
    offset = 0
    for p in params:
        numel = p.grad.numel()
        p.grad.copy_(flat[offset:offset + numel].view_as(p.grad))
        offset += numel


# Buffers that a training step changes: BatchNorm's running statistics and the mapping network's moving average of w.
# The others (resampling filters, StyleGAN's level of detail and constant noise) are the same in every process.
RUNNING_STATISTICS = ('running_mean', 'running_var', 'w_avg')


def all_reduce_mean_buffers(module: torch.nn.Module) -> None:
    """Average the running statistics (RUNNING_STATISTICS) across processes.

    Each process updates them from its own shard of the batch; averaging keeps the copies equal,
    as DDP's buffer broadcast would, while using the statistics of every shard. The other buffers are
    left alone: rewriting them would move their version counters, and the values that networks keep
    on the host for them (a level of detail, a filter's taps) would be read from the device again at
    every step, a synchronisation that a CUDA graph cannot hold.
    """
    n = world_size()
    buffers = [b for name, b in module.named_buffers() if name.rsplit('.', 1)[-1] in RUNNING_STATISTICS]
    if n == 1 or not buffers:
        return
    flat = torch.cat([b.flatten() for b in buffers])
    torch.distributed.all_reduce(flat)
    flat /= n
    offset = 0
    for b in buffers:
        b.copy_(flat[offset:offset + b.numel()].view_as(b))
        offset += b.numel()


def check_ddp_consistency(module: torch.nn.Module, ignore_regex: str | None = None) -> None:
    """Assert that every parameter and buffer is identical across processes (debug aid)."""
    import re
    if world_size() == 1:
        return
    for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
        if ignore_regex is not None and re.fullmatch(ignore_regex, name):
            continue
        other = tensor.detach().clone()
        torch.distributed.broadcast(other, src=0)
        if not torch.equal(tensor.detach().nan_to_num(), other.nan_to_num()):
            raise AssertionError(f'{name} differs between processes')


def params_and_buffers(module: torch.nn.Module) -> list[torch.Tensor]:
    return list(module.parameters()) + list(module.buffers())


@torch.no_grad()
def copy_params_and_buffers(src: torch.nn.Module, dst: torch.nn.Module, require_all: bool = False) -> None:
    """Copy same-named tensors from `src` to `dst` (used to start EMA copies and to resume)."""
    src_tensors = dict(src.named_parameters()) | dict(src.named_buffers())
    for name, tensor in list(dst.named_parameters()) + list(dst.named_buffers()):
        if name in src_tensors:
            tensor.copy_(src_tensors[name])
        elif require_all:
            raise KeyError(f'{name} missing from the source module')



@torch.no_grad()
def find_nonfinite(module: torch.nn.Module) -> str | None:
    """Name of the first parameter or floating-point buffer of `module` holding a NaN or an Inf, else None.

    One device synchronization however many tensors there are (the per-tensor flags are stacked and
    read once), so the training loop can afford it at every tick.
    """
    named = [(name, t) for name, t in list(module.named_parameters()) + list(module.named_buffers())
             if t.is_floating_point() or t.is_complex()]
    if not named:
        return None
    finite = torch.stack([torch.isfinite(t).all().to(named[0][1].device) for _, t in named])
    if bool(finite.all()):
        return None
    return named[int(finite.logical_not().nonzero()[0, 0])][0]

#----------------------------------------------------------------------------


def save_image_grid(img: np.ndarray | torch.Tensor, path: str, grid_size: tuple[int, int]) -> None:
    """Write a [N, C, H, W] batch in [-1, 1] as one PNG of gw x gh tiles (atomically)."""
    img = torch.as_tensor(img).detach().to(torch.float32).cpu()
    img = (img * 127.5 + 128).clamp(0, 255).to(torch.uint8).numpy()
    gw, gh = grid_size
    _, c, h, w = img.shape
    img = img[:gw * gh].reshape(gh, gw, c, h, w).transpose(0, 3, 1, 4, 2).reshape(gh * h, gw * w, c)
    image = PIL.Image.fromarray(img[:, :, 0] if c == 1 else img, 'L' if c == 1 else 'RGB')
    with dnnlib.util.atomic_path(path, suffix='.png') as tmp:
        image.save(tmp)
