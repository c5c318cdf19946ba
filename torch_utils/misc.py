"""Small helpers: shape assertions, seeding, image grids, and the bits of torch.distributed the training loop needs."""

from __future__ import annotations

import random
from typing import Iterable, Sequence

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


def all_reduce_mean_buffers(module: torch.nn.Module) -> None:
    """Average floating-point buffers across processes (BatchNorm running statistics, StyleGAN's w_avg).

    Each process updates them from its own shard of the batch; averaging keeps the copies equal,
    as DDP's buffer broadcast would, while using the statistics of every shard.
    """
    n = world_size()
    buffers = [b for b in module.buffers() if b.is_floating_point()]
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
