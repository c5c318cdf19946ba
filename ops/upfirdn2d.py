"""Upsample, FIR-filter and downsample 2-D images in one op (upfirdn2d).

Along each spatial axis, for input x of length L, the op computes
    1. zero insertion: u[i * up] = x[i], the other L * up - L samples are 0 (length L * up),
    2. padding with p0 zeros in front and p1 behind (a negative amount crops),
    3. FIR filtering, convolution with f by default (correlation with flip_filter=True),
       keeping only outputs where the filter lies fully inside the padded signal,
    4. downsampling: keep every down-th sample, starting with the first,
so the output length is (L * up + p0 + p1 - len(f)) // down + 1. This is what
scipy.signal.upfirdn does along one axis, up to the padding convention.

A 2-D filter is applied as is; a 1-D filter is separable and applied along
both axes. The op is linear in x and its adjoint is again an upfirdn2d (up and
down swapped, the filter flipped, the padding transposed), so both paths get
gradients of every order by calling themselves (_UpFirDn2d).
"""

import collections
import dataclasses
import functools
import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F

from torch_utils import kernel_choice

_plugin = kernel_choice.LazyPlugin('upfirdn2d', module_name='gngan_upfirdn2d_plugin',
                                   sources=['upfirdn2d.cpp', 'upfirdn2d.cu'], headers=['upfirdn2d.h'],
                                   source_dir=os.path.dirname(__file__))

IntPair = Union[int, Sequence[int]]
Padding = Union[int, Sequence[int]]


def _parse_scaling(scaling: IntPair) -> Tuple[int, int]:
    """int or [x, y] -> (x, y), each >= 1."""
    if isinstance(scaling, int):
        scaling = [scaling, scaling]
    sx, sy = [int(s) for s in scaling]
    if sx < 1 or sy < 1:
        raise ValueError(f'upfirdn2d: up/down factors must be >= 1, got {list(scaling)}')
    return sx, sy


def _parse_padding(padding: Padding) -> Tuple[int, int, int, int]:
    """int, [x, y] or [x0, x1, y0, y1] -> (x0, x1, y0, y1)."""
    if isinstance(padding, int):
        padding = [padding, padding]
    padding = [int(p) for p in padding]
    if len(padding) == 2:
        px, py = padding
        padding = [px, px, py, py]
    if len(padding) != 4:
        raise ValueError(f'upfirdn2d: padding must be an int, [x, y] or [x0, x1, y0, y1], got {padding}')
    return tuple(padding)


def _get_filter_size(f: Optional[torch.Tensor]) -> Tuple[int, int]:
    """(width, height) of a filter from setup_filter(); None is the 1x1 identity filter."""
    if f is None:
        return 1, 1
    if f.ndim == 1:
        return f.shape[0], f.shape[0]
    return f.shape[1], f.shape[0]


def setup_filter(f, device: torch.device = torch.device('cpu'), normalize: bool = True, flip_filter: bool = False,
                 gain: float = 1, separable: Optional[bool] = None) -> torch.Tensor:
    """Turn a list/array of taps into a float32 filter tensor for upfirdn2d.

    A 1-D filter becomes separable (kept 1-D) when it has 8 or more taps, and
    otherwise the 2-D outer product f f^T (a single 2-D pass is faster for
    short filters). normalize makes the taps sum to 1 (unit DC gain); gain
    multiplies the whole 2-D response, i.e. each 1-D pass by sqrt(gain).
    """
    f = torch.as_tensor(1 if f is None else f, dtype=torch.float32)
    if f.ndim == 0:
        f = f[np.newaxis]
    if f.ndim not in (1, 2) or f.numel() == 0:
        raise ValueError(f'setup_filter: expected a non-empty 1-D or 2-D filter, got shape {list(f.shape)}')
    if separable is None:
        separable = f.ndim == 1 and f.numel() >= 8
    if f.ndim == 1 and not separable:
        f = torch.outer(f, f)
    if normalize:
        f = f / f.sum()
    if flip_filter:
        f = f.flip(list(range(f.ndim)))
    if f.ndim == 1 and gain < 0:
        raise ValueError('setup_filter: a separable filter cannot carry a negative gain')
    f = f * (gain ** (f.ndim / 2))
    return f.to(device=device)


def upfirdn2d(x: torch.Tensor, f: Optional[torch.Tensor], up: IntPair = 1, down: IntPair = 1, padding: Padding = 0,
              flip_filter: bool = False, gain: float = 1, impl: str = 'cuda') -> torch.Tensor:
    """Upsample, pad, FIR-filter and downsample a batch of images (see the module docstring).

    x: [batch, channels, height, width]. f: float32 filter from setup_filter(), 1-D (separable)
    or 2-D [height, width], or None (identity). up, down: int or [x, y]. padding: int, [x, y]
    or [x0, x1, y0, y1], in samples of the upsampled signal. flip_filter: False = convolution,
    True = correlation. gain: overall scale of the output. impl: 'cuda' or 'ref' (see bias_act).
    The output has the memory format of x (channels_last in, channels_last out).
    """
    key = ('upfirdn2d', _hashable(up), _hashable(down), _hashable(padding), flip_filter, gain, impl)
    cfg = _configs.get(key)
    if cfg is None:
        _check_impl(impl)
        cfg = _configs[key] = _Config(up=_parse_scaling(up), down=_parse_scaling(down),
                                      padding=_parse_padding(padding), flip_filter=bool(flip_filter), gain=float(gain))
    return _upfirdn2d(x, f, cfg, impl)


_configs: Dict[tuple, '_Config'] = {}  # the arguments of upfirdn2d() and the wrappers below, as passed -> _Config
_identity_filters: Dict[torch.device, torch.Tensor] = {}  # f=None on each device


def _hashable(value: Union[int, Sequence[int]]) -> Union[int, Tuple[int, ...]]:
    return value if isinstance(value, int) else tuple(value)


def _check_impl(impl: str) -> None:
    if impl not in ('cuda', 'ref'):
        raise ValueError(f'upfirdn2d: impl must be "cuda" or "ref", got {impl!r}')


def _upfirdn2d(x: torch.Tensor, f: Optional[torch.Tensor], cfg: '_Config', impl: str) -> torch.Tensor:
    """upfirdn2d with its settings parsed: one dictionary look-up when the arguments' metadata was seen before."""
    if f is None:
        f = _identity_filters.get(x.device)
        if f is None:
            f = _identity_filters[x.device] = torch.ones([1, 1], dtype=torch.float32, device=x.device)
    if f.requires_grad:
        raise ValueError('upfirdn2d: the filter must not require gradients')
    kernel_path = impl == 'cuda' and _plugin.usable(x.device)
    key = (x.device, x.dtype, x.shape, x.stride(), f.shape, f.dtype, cfg, kernel_path)
    plan = _plugin.plans.get(key)
    if plan is None:
        plan = _plugin.plans[key] = _plan_call(x, f, cfg, kernel_path)
    else:
        _plugin.plans.move_to_end(key)
    if plan is _KERNEL:
        return _UpFirDn2d.apply(x, f, cfg, _run_kernel)
    if plan is _REFERENCE_ON_DEVICE and torch.is_autocast_enabled(x.device.type):
        with torch.autocast(x.device.type, enabled=False):  # the result's dtype does not depend on the choice
            return _UpFirDn2d.apply(x, f, cfg, _upfirdn2d_ref)
    return _UpFirDn2d.apply(x, f, cfg, _upfirdn2d_ref)


_KERNEL, _REFERENCE, _REFERENCE_ON_DEVICE = 'kernel', 'reference', 'reference on the device'  # the plans


def _plan_call(x: torch.Tensor, f: torch.Tensor, cfg: '_Config', kernel_path: bool) -> str:
    """How calls with the metadata of (x, f) are served (_KERNEL, _REFERENCE, or _REFERENCE_ON_DEVICE: with autocast
    off): checks the arguments, and on the kernel path runs the self-check and the chooser."""
    if x.ndim != 4:
        raise ValueError(f'upfirdn2d: expected x of shape [N, C, H, W], got {list(x.shape)}')
    if f.ndim not in (1, 2) or f.numel() == 0 or not f.is_floating_point():
        raise ValueError(f'upfirdn2d: expected a non-empty 1-D or 2-D float filter, got shape {list(f.shape)}')
    out_w, out_h = cfg.output_size(x.shape[3], x.shape[2], *_get_filter_size(f))
    if out_w < 1 or out_h < 1:
        raise ValueError(f'upfirdn2d: input {list(x.shape)} with filter {list(f.shape)}, up {cfg.up}, '
                         f'down {cfg.down}, padding {cfg.padding} leaves an empty output')
    if not kernel_path:
        return _REFERENCE
    # The kernels read and write any strides: a channels_last x gets a channels_last result, without copies.
    channels_last = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    config = (x.device, x.dtype, cfg, tuple(f.shape), channels_last)
    if _plugin.trusted(config, lambda: _self_check(*config, f.detach().to(x.device)), x.dtype) and \
            _plugin.faster((config, tuple(x.shape)), lambda x: _UpFirDn2d.apply(x, f, cfg, _run_kernel),
                           lambda x: _UpFirDn2d.apply(x, f, cfg, _upfirdn2d_ref), x):
        return _KERNEL
    return _REFERENCE_ON_DEVICE


@dataclasses.dataclass(frozen=True)
class _Config:
    up: Tuple[int, int]  # (x, y) zero-insertion factors
    down: Tuple[int, int]  # (x, y) decimation factors
    padding: Tuple[int, int, int, int]  # (x0, x1, y0, y1), negative crops
    flip_filter: bool  # False = convolution, True = correlation
    gain: float  # output scale

    def output_size(self, in_w: int, in_h: int, f_w: int, f_h: int) -> Tuple[int, int]:
        px0, px1, py0, py1 = self.padding
        out_w = (in_w * self.up[0] + px0 + px1 - f_w) // self.down[0] + 1
        out_h = (in_h * self.up[1] + py0 + py1 - f_h) // self.down[1] + 1
        return out_w, out_h

    def adjoint(self, in_w: int, in_h: int, out_w: int, out_h: int, f_w: int, f_h: int) -> '_Config':
        """The upfirdn2d that maps output-shaped gradients back onto the input: the adjoint.

        Per axis, with input length L, output length M, filter length k: the
        transpose of "subsample by d" is "zero-insert by d", the transpose of a
        valid correlation with f is a full convolution (pad k - 1 on both
        sides, correlate with f flipped), and the transpose of "zero-insert by
        u, pad (p0, p1)" is "crop (p0, p1), keep every u-th sample". Merged into
        one padding: front k - 1 - p0, back L*u + p0 - M*d - (u - 1); the last
        u - 1 samples would be discarded by the final subsampling anyway.
        """
        px0, _, py0, _ = self.padding
        (ux, uy), (dx, dy) = self.up, self.down
        padding = (f_w - 1 - px0, in_w * ux + px0 - out_w * dx - (ux - 1),
                   f_h - 1 - py0, in_h * uy + py0 - out_h * dy - (uy - 1))
        return _Config(up=self.down, down=self.up, padding=padding, flip_filter=not self.flip_filter, gain=self.gain)


def _upfirdn2d_ref(x: torch.Tensor, f: torch.Tensor, cfg: _Config) -> torch.Tensor:
    """Standard ops (zero insertion by strided assignment, padding, depthwise F.conv2d with stride).

    Differentiable by torch's autograd as it stands (the tests' independent reference); upfirdn2d()
    runs it inside _UpFirDn2d, whose backward is the adjoint op rather than the gradients of these
    ops: in a double backward (gradient normalization, R1) torch would also differentiate the
    depthwise convolutions' own backward (per-sample convolutions, fills and copies), more than the op costs.
    """
    batch, channels, in_h, in_w = x.shape
    (upx, upy), (downx, downy) = cfg.up, cfg.down
    if upx > 1 or upy > 1:
        upsampled = x.new_zeros([batch, channels, in_h * upy, in_w * upx])
        upsampled[:, :, ::upy, ::upx] = x
        x = upsampled
    px0, px1, py0, py1 = cfg.padding
    pad_x, pad_y = 0, 0  # Zero padding done by the convolution itself: symmetric and not a crop.
    if px0 == px1 >= 0 and py0 == py1 >= 0:
        pad_x, pad_y = px0, py0
    else:
        x = F.pad(x, list(cfg.padding))  # F.pad crops for negative amounts

    # F.conv2d computes a correlation, so a convolution flips the filter. A
    # stride equal to the downsampling factor evaluates only the kept outputs.
    f = f.to(x.dtype)
    if not cfg.flip_filter:
        f = f.flip(list(range(f.ndim)))
    if f.ndim == 2:
        weight = (f * cfg.gain)[np.newaxis, np.newaxis].repeat([channels, 1, 1, 1])
        return F.conv2d(x, weight, stride=(downy, downx), padding=(pad_y, pad_x), groups=channels)
    weight_x = (f * cfg.gain).reshape(1, 1, 1, -1).repeat([channels, 1, 1, 1])
    weight_y = f.reshape(1, 1, -1, 1).repeat([channels, 1, 1, 1])
    x = F.conv2d(x, weight_x, stride=(1, downx), padding=(0, pad_x), groups=channels)
    return F.conv2d(x, weight_y, stride=(downy, 1), padding=(pad_y, 0), groups=channels)


# ----------------------------------------------------------------------------
# CUDA path.

class _TapCache:
    """Kernel-ready taps of each filter buffer, made once rather than on every call.

    The kernels correlate, with the gain folded into the taps: for a given filter tensor, flip and
    gain this means one flip, one multiplication and (for filters of up to 4x4 taps, which the
    specialised kernels take by value) one copy to the host, which makes the host wait for the GPU:
    it must not happen inside a training step that a CUDA graph captures, so the filters a step uses
    at every call must stay cached. An entry is kept per filter tensor, flip, gain, shape and dtype;
    it holds a reference to its filter, so that memory cannot be reused by another tensor while
    cached, and the filter's version, so that an in-place change of the filter (G_ema's buffers are
    copied from G's after every G step) rebuilds that entry rather than adding one. At most `size`
    entries: a hit marks its entry used, and one more drops the least recently used, so that grids
    and metric evaluations of other networks never push out the filters of the training step.
    """

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self.entries: 'collections.OrderedDict[tuple, tuple]' = collections.OrderedDict()  # Least recently used first.

    def get(self, f: torch.Tensor, flip: bool, gain: float, shape: Tuple[int, int],
            dtype: torch.dtype) -> Tuple[torch.Tensor, List[float]]:
        """(taps [h, w] on f's device in `dtype`, the same on the host if at most 4x4 else [])."""
        key = (id(f), flip, gain, shape, dtype)
        entry = self.entries.get(key)
        if entry is not None and entry[0] is f and entry[1] == f._version:
            self.entries.move_to_end(key)
            return entry[2], entry[3]
        taps = f.detach().to(dtype)
        if flip:
            taps = taps.flip(list(range(taps.ndim)))
        taps = (taps * gain).reshape(shape).contiguous()
        host = taps.flatten().tolist() if max(shape) <= MAX_FIXED_TAPS else []
        self.entries[key] = (f, f._version, taps, host)
        self.entries.move_to_end(key)
        if len(self.entries) > self.size:
            self.entries.popitem(last=False)
        return taps, host


MAX_FIXED_TAPS = 4  # UPFIRDN2D_MAX_FIXED_TAPS in upfirdn2d.h
_taps = _TapCache()


def _run_kernel(x: torch.Tensor, f: torch.Tensor, cfg: _Config, max_grid_z: int = 0) -> torch.Tensor:
    """One kernel launch per 2-D filter, two (x pass, then y pass) for a separable one.

    The kernel always correlates, with the gain folded into the taps. max_grid_z: see upfirdn2d.cpp.
    """
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    flip = not cfg.flip_filter
    (upx, upy), (downx, downy), (px0, px1, py0, py1) = cfg.up, cfg.down, cfg.padding
    plugin = _plugin.module  # loaded: the kernel path is taken only where _plugin.usable()
    if f.ndim == 2:
        taps, host = _taps.get(f, flip, cfg.gain, tuple(f.shape), dtype)
        return plugin.upfirdn2d(x, taps, host, upx, upy, downx, downy, px0, px1, py0, py1, max_grid_z)
    taps, host = _taps.get(f, flip, cfg.gain, (1, f.shape[0]), dtype)
    x = plugin.upfirdn2d(x, taps, host, upx, 1, downx, 1, px0, px1, 0, 0, max_grid_z)
    taps, host = _taps.get(f, flip, 1.0, (f.shape[0], 1), dtype)
    return plugin.upfirdn2d(x, taps, host, 1, upy, 1, downy, 0, 0, py0, py1, max_grid_z)


@functools.lru_cache(maxsize=4096)
def _adjoint(cfg: _Config, sizes: Tuple[int, ...]) -> _Config:
    """cfg.adjoint(*sizes), made once per configuration and size."""
    return cfg.adjoint(*sizes)


class _UpFirDn2d(torch.autograd.Function):
    """upfirdn2d by `run` (_run_kernel or _upfirdn2d_ref); its backward is the adjoint upfirdn2d by
    the same `run`, so gradients of every order are this Function again."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, f: torch.Tensor, cfg: _Config,  # pylint: disable=arguments-differ
                run: Callable[[torch.Tensor, torch.Tensor, _Config], torch.Tensor]) -> torch.Tensor:
        y = run(x, f, cfg)
        ctx.save_for_backward(f)
        ctx.cfg = cfg
        ctx.run = run
        ctx.sizes = (x.shape[3], x.shape[2], y.shape[3], y.shape[2], f.shape[-1], f.shape[0])  # f: [w] or [h, w]
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):  # pylint: disable=arguments-differ
        f, = ctx.saved_tensors
        dx = None
        if ctx.needs_input_grad[0]:
            dx = _UpFirDn2d.apply(dy, f, _adjoint(ctx.cfg, ctx.sizes), ctx.run)
        return dx, None, None, None


def _self_check(device: torch.device, dtype: torch.dtype, cfg: _Config, filter_shape: Tuple[int, ...],
                channels_last: bool, f: torch.Tensor) -> Tuple[float, str]:
    """The kernel against the reference for one configuration, filter and layout (see kernel_choice).

    The output spans 3 x 3 tiles of the specialised kernel (64 x 16 pixels; 5 x 5 blocks of 32 x 8
    threads of the generic one) and 6 image planes; a second launch allows 4 planes per grid, so the
    kernels' loop over the remaining planes runs too.
    """
    f_w, f_h = _get_filter_size(f)
    in_w, in_h = 1, 1
    while cfg.output_size(in_w, in_h, f_w, f_h)[0] < 130:
        in_w += 1
    while cfg.output_size(in_w, in_h, f_w, f_h)[1] < 34:
        in_h += 1
    generator = torch.Generator(device=device).manual_seed(0)
    x = torch.randn([2, 3, in_h, in_w], generator=generator, device=device, dtype=torch.float64).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    kernels = [functools.partial(_run_kernel, max_grid_z=max_grid_z) for max_grid_z in (0, 4)]
    return kernel_choice.worst_of([kernel_choice.compare_to_reference(lambda x: _UpFirDn2d.apply(x, f, cfg, kernel),
                                                                      lambda x: _upfirdn2d_ref(x, f, cfg), [x], ['x'])
                                   for kernel in kernels])


# ----------------------------------------------------------------------------
# Convenience wrappers with the padding that keeps the image centered.

def _wrapper_config(kind: str, scaling: IntPair, padding: Padding, f: Optional[torch.Tensor], flip_filter: bool,
                    gain: float, impl: str) -> _Config:
    """The _Config of filter2d / upsample2d / downsample2d: the padding that keeps the image centered."""
    key = (kind, _hashable(scaling), _hashable(padding), None if f is None else f.shape, flip_filter, gain, impl)
    cfg = _configs.get(key)
    if cfg is None:
        _check_impl(impl)
        sx, sy = _parse_scaling(scaling)
        px0, px1, py0, py1 = _parse_padding(padding)
        fw, fh = _get_filter_size(f)
        if kind == 'filter':
            padding = [px0 + fw // 2, px1 + (fw - 1) // 2, py0 + fh // 2, py1 + (fh - 1) // 2]
            cfg = _Config(up=(1, 1), down=(1, 1), padding=tuple(padding), flip_filter=bool(flip_filter),
                          gain=float(gain))
        elif kind == 'up':
            # The zero insertion keeps 1 sample in up**2, so the gain is raised by up**2.
            padding = [px0 + (fw + sx - 1) // 2, px1 + (fw - sx) // 2, py0 + (fh + sy - 1) // 2, py1 + (fh - sy) // 2]
            cfg = _Config(up=(sx, sy), down=(1, 1), padding=tuple(padding), flip_filter=bool(flip_filter),
                          gain=float(gain * sx * sy))
        else:
            padding = [px0 + (fw - sx + 1) // 2, px1 + (fw - sx) // 2, py0 + (fh - sy + 1) // 2, py1 + (fh - sy) // 2]
            cfg = _Config(up=(1, 1), down=(sx, sy), padding=tuple(padding), flip_filter=bool(flip_filter),
                          gain=float(gain))
        cfg = _configs[key] = cfg
    return cfg


def filter2d(x: torch.Tensor, f: Optional[torch.Tensor], padding: Padding = 0, flip_filter: bool = False,
             gain: float = 1, impl: str = 'cuda') -> torch.Tensor:
    """FIR-filter x, keeping its size (plus the extra padding given)."""
    return _upfirdn2d(x, f, _wrapper_config('filter', 1, padding, f, flip_filter, gain, impl), impl)


def upsample2d(x: torch.Tensor, f: Optional[torch.Tensor], up: IntPair = 2, padding: Padding = 0,
               flip_filter: bool = False, gain: float = 1, impl: str = 'cuda') -> torch.Tensor:
    """Upsample x by `up` with interpolation filter f: output size = input size * up.

    The zero insertion keeps 1 sample in up**2, so the gain is raised by up**2
    to preserve the mean value of the image.
    """
    return _upfirdn2d(x, f, _wrapper_config('up', up, padding, f, flip_filter, gain, impl), impl)


def downsample2d(x: torch.Tensor, f: Optional[torch.Tensor], down: IntPair = 2, padding: Padding = 0,
                 flip_filter: bool = False, gain: float = 1, impl: str = 'cuda') -> torch.Tensor:
    """Anti-alias x with filter f and downsample by `down`: output size = input size / down."""
    return _upfirdn2d(x, f, _wrapper_config('down', down, padding, f, flip_filter, gain, impl), impl)
