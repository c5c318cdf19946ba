"""Cases and runs of the ops' kernels that their CPU tests (through the host build) and their GPU tests
(tests/test_ops_gpu.py) share: upfirdn2d's cases and compile-time specialisations, scipy's 1-D upfirdn in this
project's semantics, and the runs of the filter cache and of the deterministic kernel choice."""

import contextlib
import sys

import numpy as np
import scipy.signal
import torch

from ops import bias_act, upfirdn2d
from torch_utils import devices, kernel_choice

UPFIRDN2D_CASES = [  # (filter taps or 2-D shape, up, down, padding, flip_filter, gain)
    ([1, 3, 3, 1], 2, 1, [2, 1, 2, 1], False, 4.0),
    ([1, 3, 3, 1], 1, 2, [1, 1, 1, 1], False, 1.0),
    ([1, 2, 5, 2, 1, 3, 1, 1], [2, 1], [1, 3], [3, -1, 0, 2], True, 1.0),  # separable: two kernel passes
    ((3, 2), [1, 2], [4, 1], [-1, 2, 2, 0], False, -2.0),  # non-separable random 2-D filter
    ((5, 5), 4, 2, [0, 3, 4, -2], True, 0.5),
]

# Every compile-time specialisation: (up, down) on both axes and a square filter of 1-4 taps.
SPECIALISATIONS = [(up, down, taps) for up, down in [(1, 1), (2, 1), (1, 2)] for taps in (1, 2, 3, 4)]


def upfirdn_1d(x, h, up, down, pad0, pad1):
    """Our 1-D semantics along the last axis of x, from scipy's upfirdn.

    scipy convolves the zero-inserted x, (len(x) - 1) * up + 1 samples, with h
    in 'full' mode, so its output n sees the input padded by len(h) - 1 in
    front. Ours pads by pad0 instead, so our sample k (before decimation) is
    scipy's sample k + len(h) - 1 - pad0; delaying h by zeros realizes a
    negative shift within scipy itself, decimation included.
    """
    length = x.shape[-1]
    out_len = (length * up + pad0 + pad1 - len(h)) // down + 1
    shift = len(h) - 1 - pad0
    if shift <= 0:
        y = scipy.signal.upfirdn(np.concatenate([np.zeros(-shift), h]), x, up=up, down=down, axis=-1)
    else:
        y = scipy.signal.upfirdn(h, x, up=up, axis=-1)[..., shift::down]
    y = y[..., :out_len]
    return np.concatenate([y, np.zeros(y.shape[:-1] + (out_len - y.shape[-1],))], axis=-1)


@contextlib.contextmanager
def sync_debug_mode(mode: str):
    """CUDA's synchronisation watch at `mode` ('error': a host synchronisation raises) inside, as it was after."""
    saved = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(saved)


def training_filter_among_other_filters(device: torch.device, monkeypatch, others: int = 300) -> int:
    """A training step's filter used between `others` (more than the cache's 256) new filter buffers, as grids and
    metric evaluations of other networks bring them: how many times the training filter's taps were built again, each
    a copy to the host that makes the host wait for the GPU. Every call is checked against scipy's upfirdn. The caller
    has made the kernel path serve `device`'s tensors; on CUDA the training filter's calls run under
    torch.cuda.set_sync_debug_mode('error'), so that a host synchronisation among them raises."""
    taps = np.array([1., 3., 3., 1.]) / 8
    f = upfirdn2d.setup_filter([1, 3, 3, 1], device=device)
    x = torch.randn([2, 3, 6, 7], generator=torch.Generator().manual_seed(0)).to(device)
    expected = upfirdn_1d(upfirdn_1d(x.double().cpu().numpy(), taps, 2, 1, 2, 1).swapaxes(-1, -2),
                           taps, 2, 1, 2, 1).swapaxes(-1, -2) * 4
    upfirdn2d.upsample2d(x, f)  # Its taps built and its call planned before the count.
    copies_to_host = [0]
    tolist = torch.Tensor.tolist

    def counted_tolist(self):  # Those of upfirdn2d itself (the host build of the kernels checks its taps with one too).
        copies_to_host[0] += sys._getframe(1).f_globals.get('__name__') == upfirdn2d.__name__
        return tolist(self)
    rebuilds = 0
    for index in range(others):
        upfirdn2d.upsample2d(x, upfirdn2d.setup_filter([1, 2 + index % 3, 1], device=device))  # A new buffer each time.
        monkeypatch.setattr(torch.Tensor, 'tolist', counted_tolist)
        with sync_debug_mode('error') if device.type == 'cuda' else contextlib.nullcontext():
            y = upfirdn2d.upsample2d(x, f)
        monkeypatch.setattr(torch.Tensor, 'tolist', tolist)
        rebuilds, copies_to_host[0] = rebuilds + copies_to_host[0], 0
        np.testing.assert_allclose(y.double().cpu().numpy(), expected, rtol=1e-5, atol=1e-6)
    return rebuilds


def two_deterministic_runs(device: torch.device, monkeypatch) -> tuple[list, list, list]:
    """Two runs of the same resampling and activations, forward and backward, under --deterministic's switches, with the
    chooser switched on and each op's choices made afresh per run, timed by a clock on which the reference is five
    times faster in the first run and the kernel in the second (a timing that changes between runs, as a GPU's does).
    Returns (the paths the clock was asked to time, the first run's results, the second's). The caller has made the
    kernel path serve `device`'s tensors."""
    monkeypatch.setenv(kernel_choice.AUTOTUNE_ENV, '1')
    timed, runs = [], []
    for faster in ('reference', 'kernel'):
        def timer(fn, timer_device, faster=faster):  # faster() times the kernel first, then the reference.
            path = 'kernel' if len(timed) % 2 == 0 else 'reference'
            timed.append(path)
            fn()
            return 1.0 if path == faster else 5.0
        for plugin in (upfirdn2d._plugin, bias_act._plugin):
            monkeypatch.setattr(plugin, 'timer', timer)
            plugin.choices = {}
        generator = torch.Generator().manual_seed(0)
        x = torch.randn([2, 4, 16, 16], generator=generator).to(device).requires_grad_()
        b = torch.randn([4], generator=generator).to(device).requires_grad_()
        f = upfirdn2d.setup_filter([1, 3, 3, 1], device=device)
        with devices.run_switches(device, allow_tf32=False, deterministic=True):
            y = upfirdn2d.downsample2d(bias_act.bias_act(upfirdn2d.upsample2d(x, f), b, act='lrelu'), f)
            gx, gb = torch.autograd.grad(y.square().sum(), [x, b])
        runs.append([y.detach(), gx, gb])
    return timed, runs[0], runs[1]
