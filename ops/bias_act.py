"""Fused bias + activation + gain + clamp.

    y = clamp(gain * act(x + b), -clamp, clamp)

with b broadcast along dimension `dim` of x. Unfused, this is four memory
passes forward and as many backward; the CUDA kernel does each direction in
one pass. Both implementations are differentiable twice (gradient
normalization and R1 back-propagate through the input gradient of every
discriminator layer).
"""

import dataclasses
import math
import os
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from torch_utils import kernel_choice


@dataclasses.dataclass(frozen=True)
class ActivationSpec:
    func: Callable  # reference implementation: func(x, alpha) -> act(x)
    def_alpha: float  # default alpha (slope/scale parameter; unused by most activations)
    def_gain: float  # default gain, chosen to roughly preserve the signal magnitude
    cuda_id: int  # activation index understood by the kernel (enum in bias_act.h)
    is_piecewise_linear: bool  # True when act'' = 0 almost everywhere (no second-order term)


activation_funcs = {
    'linear':   ActivationSpec(lambda x, alpha: x,                          0.0, 1.0,          1, True),
    'relu':     ActivationSpec(lambda x, alpha: F.relu(x),                  0.0, math.sqrt(2), 2, True),
    'lrelu':    ActivationSpec(lambda x, alpha: F.leaky_relu(x, alpha),     0.2, math.sqrt(2), 3, True),
    'tanh':     ActivationSpec(lambda x, alpha: torch.tanh(x),              0.0, 1.0,          4, False),
    'sigmoid':  ActivationSpec(lambda x, alpha: torch.sigmoid(x),           0.0, 1.0,          5, False),
    'elu':      ActivationSpec(lambda x, alpha: F.elu(x, alpha),            1.0, 1.0,          6, False),
    'selu':     ActivationSpec(lambda x, alpha: F.selu(x),                  0.0, 1.0,          7, False),
    'softplus': ActivationSpec(lambda x, alpha: F.softplus(x),              0.0, 1.0,          8, False),
    'swish':    ActivationSpec(lambda x, alpha: torch.sigmoid(x) * x,       0.0, math.sqrt(2), 9, False),
}

_plugin = kernel_choice.LazyPlugin('bias_act', module_name='gngan_bias_act_plugin',
                                   sources=['bias_act.cpp', 'bias_act.cu'], headers=['bias_act.h'],
                                   source_dir=os.path.dirname(__file__))


def bias_act(x: torch.Tensor, b: Optional[torch.Tensor] = None, dim: int = 1, act: str = 'linear',
             alpha: Optional[float] = None, gain: Optional[float] = None, clamp: Optional[float] = None,
             impl: str = 'cuda') -> torch.Tensor:
    """Add bias b along dimension dim, apply activation act, multiply by gain, clamp to [-clamp, clamp].

    x: input of any shape; b: 1-D bias with x.shape[dim] entries, or None.
    act: one of activation_funcs ('linear', 'relu', 'lrelu', 'tanh', 'sigmoid', 'elu', 'selu',
    'softplus', 'swish'). alpha, gain: None means the activation's default (lrelu: alpha 0.2,
    gain sqrt(2)). clamp: None or a non-negative bound on the output magnitude.
    impl: 'cuda' uses the fused kernel for CUDA tensors (the reference for CPU tensors, or when
    the kernel cannot be built or fails its self-check); 'ref' always uses plain PyTorch ops.
    The output has the memory layout of x (channels_last in, channels_last out).
    """
    params = _params.get((act, alpha, gain, clamp, impl))
    if params is None:
        params = _params[act, alpha, gain, clamp, impl] = _parse_params(act, alpha, gain, clamp, impl)
    if impl == 'cuda' and _plugin.usable(x.device):
        # One dictionary look-up per call: everything that depends on the arguments' metadata
        # (validity, memory order, self-check verdict, the chooser's decision) is worked out on the
        # first call with that metadata and kept in _plugin.plans.
        key = (x.device, x.dtype, x.shape, x.stride(), None if b is None else b.shape, dim, act, alpha, gain, clamp)
        call = _plugin.plans.get(key)
        if call is None:
            call = _plugin.plans[key] = _plan_cuda_call(x, b, _check_dim(x, b, dim), act, *params)
        else:
            _plugin.plans.move_to_end(key)
        cfg, dim, order, inverse = call
        if cfg is not None:
            return _apply_kernel(x, b, cfg, order, inverse)
        if torch.is_autocast_enabled(x.device.type):
            with torch.autocast(x.device.type, enabled=False):  # the result's dtype does not depend on the choice
                return _bias_act_ref(x, b, dim, *params)
        return _bias_act_ref(x, b, dim, *params)
    key = (x.shape, None if b is None else b.shape, dim)
    checked_dim = _checked_dims.get(key)
    if checked_dim is None:
        checked_dim = _checked_dims[key] = _check_dim(x, b, dim)
    else:
        _checked_dims.move_to_end(key)
    return _bias_act_ref(x, b, checked_dim, *params)


_Params = Tuple[ActivationSpec, float, float, float]
_params: Dict[tuple, _Params] = {}  # (act, alpha, gain, clamp, impl) as passed -> validated (spec, alpha, gain, clamp)
_checked_dims = kernel_choice.LruCache()  # (x.shape, b.shape, dim) of the reference path -> dim in [0, x.ndim)


def _parse_params(act: str, alpha: Optional[float], gain: Optional[float], clamp: Optional[float],
                  impl: str) -> _Params:
    if impl not in ('cuda', 'ref'):
        raise ValueError(f'bias_act: impl must be "cuda" or "ref", got {impl!r}')
    if act not in activation_funcs:
        raise ValueError(f'bias_act: unknown activation {act!r}; expected one of {", ".join(activation_funcs)}')
    if clamp is not None and clamp < 0:
        raise ValueError(f'bias_act: clamp must be non-negative, got {clamp}')
    spec = activation_funcs[act]
    return (spec, float(spec.def_alpha if alpha is None else alpha), float(spec.def_gain if gain is None else gain),
            float(-1 if clamp is None else clamp))  # clamp negative: no clamping


def _check_dim(x: torch.Tensor, b: Optional[torch.Tensor], dim: int) -> int:
    """dim in [0, x.ndim), after checking it and the bias against x."""
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(f'bias_act: dim {dim} is out of range for a tensor with {x.ndim} dimensions')
    dim = dim % x.ndim
    if b is not None and (b.ndim != 1 or b.shape[0] != x.shape[dim]):
        raise ValueError(f'bias_act: bias of shape {list(b.shape)} does not match dimension {dim} of '
                         f'input shape {list(x.shape)}')
    return dim


_Call = Tuple[Optional['_CudaConfig'], int, Optional[List[int]], Optional[List[int]]]


def _plan_cuda_call(x: torch.Tensor, b: Optional[torch.Tensor], dim: int, act: str, spec: ActivationSpec,
                    alpha: float, gain: float, clamp: float) -> _Call:
    """How calls with the metadata of (x, b) are served: (cfg, dim, order, inverse); cfg None: the reference.

    The kernel reads x in memory order: a dense x in any layout (channels_last included) is passed
    as the contiguous tensor x.permute(order), and the result is permuted back by inverse, so y has
    the layout of x (order None: x is contiguous, or not dense and copied first). Both happen outside
    the autograd Function, with differentiable ops, so the x saved for the backward pass is linked to
    the caller's x (second-order gradients flow back to it).
    """
    order = _memory_order(x)
    inverse = None
    if order is None or order == sorted(order):
        order = None
    else:
        inverse = [order.index(i) for i in range(x.ndim)]
    cfg = _CudaConfig(dim=dim if order is None else order.index(dim), act=act, alpha=alpha, gain=gain, clamp=clamp)
    config = (x.device, x.dtype, cfg, b is not None, x.ndim)
    if _plugin.trusted(config, lambda: _self_check(*config), x.dtype) and \
            _plugin.faster((config, tuple(x.shape), tuple(x.stride())),
                           lambda x: _apply_kernel(x, b, cfg, order, inverse),
                           lambda x: _bias_act_ref(x, b, dim, spec, alpha, gain, clamp), x):
        return cfg, dim, order, inverse
    return None, dim, None, None


def _apply_kernel(x: torch.Tensor, b: Optional[torch.Tensor], cfg: '_CudaConfig', order: Optional[List[int]],
                  inverse: Optional[List[int]]) -> torch.Tensor:
    if order is None:
        return _BiasActCuda.apply(x.contiguous(), b, cfg)  # contiguous(): x itself where it is contiguous
    return _BiasActCuda.apply(x.permute(order), b, cfg).permute(inverse)


def _memory_order(x: torch.Tensor) -> Optional[List[int]]:
    """Dimensions of x from outermost to innermost in memory, if x is a permuted contiguous tensor, else None.

    [0, 1, 2, 3] for a contiguous NCHW tensor, [0, 2, 3, 1] for channels_last.
    """
    order = sorted(range(x.ndim), key=lambda i: -x.stride(i))  # stable: ties (size-1 dimensions) keep their order
    return order if x.permute(order).is_contiguous() else None


def _bias_act_ref(x: torch.Tensor, b: Optional[torch.Tensor], dim: int, spec: ActivationSpec, alpha: float,
                  gain: float, clamp: float) -> torch.Tensor:
    """The chain of standard ops; autograd provides derivatives of every order."""
    if b is not None:
        x = x + b.to(x.dtype).reshape([-1 if i == dim else 1 for i in range(x.ndim)])
    x = spec.func(x, alpha)
    if gain != 1:
        x = x * gain
    if clamp >= 0:
        x = x.clamp(-clamp, clamp)
    return x


# ----------------------------------------------------------------------------
# CUDA path. The kernel evaluates, per element with s = x + b,
#   mode 0: y = clamp(gain * act(s))
#   mode 1: dy * gain * act'(s) * [|gain * act(s)| <= clamp]
#   mode 2: dy * gain * act''(s) * [|gain * act(s)| <= clamp]
# Mode 1 is the input gradient; its own derivatives are mode 1 (w.r.t. dy,
# linear) and mode 2 (w.r.t. x), which gives second-order gradients.

@dataclasses.dataclass(frozen=True)
class _CudaConfig:
    dim: int  # bias dimension
    act: str  # activation name
    alpha: float  # activation parameter
    gain: float  # output gain
    clamp: float  # output bound, negative for none
    max_blocks: int = 0  # blocks per launch (0: enough for any GPU)
    max_chunk: int = 0  # elements per launch (0: the kernel's 2^30); the self-check runs small values of both
    act_id: int = dataclasses.field(init=False, compare=False, repr=False)  # ActivationSpec.cuda_id
    smooth: bool = dataclasses.field(init=False, compare=False, repr=False)  # act'' is not 0 almost everywhere

    def __post_init__(self) -> None:
        spec = activation_funcs[self.act]
        object.__setattr__(self, 'act_id', spec.cuda_id)
        object.__setattr__(self, 'smooth', not spec.is_piecewise_linear)


def _run_kernel(mode: int, x: torch.Tensor, b: Optional[torch.Tensor], dy: Optional[torch.Tensor],
                cfg: _CudaConfig) -> torch.Tensor:
    return _plugin.module.bias_act(x, None if b is None else b.to(x.dtype).contiguous(),
                                  None if dy is None else dy.to(x.dtype).contiguous(), cfg.dim, cfg.act_id, mode,
                                  cfg.alpha, cfg.gain, cfg.clamp, cfg.max_blocks, cfg.max_chunk)


def _bias_grad(dx: torch.Tensor, dim: int) -> torch.Tensor:
    return dx.sum([i for i in range(dx.ndim) if i != dim])


class _BiasActCuda(torch.autograd.Function):
    """y = bias_act(x, b) for a contiguous x; x itself is saved, so gradients of every order reach the caller's x."""

    @staticmethod
    def forward(ctx, x, b, cfg):  # pylint: disable=arguments-differ
        ctx.cfg = cfg
        ctx.save_for_backward(x, b)
        return _run_kernel(0, x, b, None, cfg)

    @staticmethod
    def backward(ctx, dy):  # pylint: disable=arguments-differ
        x, b = ctx.saved_tensors
        dx = db = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            dx = _BiasActCudaGrad.apply(dy, x, b, ctx.cfg)
        if ctx.needs_input_grad[1]:
            db = _bias_grad(dx, ctx.cfg.dim).to(b.dtype)
        return dx, db, None


class _BiasActCudaGrad(torch.autograd.Function):
    """dx = dy * d(bias_act)/dx, as a function of (dy, x, b), so that it can itself be differentiated."""

    @staticmethod
    def forward(ctx, dy, x, b, cfg):  # pylint: disable=arguments-differ
        ctx.cfg = cfg
        ctx.save_for_backward(dy, x, b)
        return _run_kernel(1, x, b, dy, cfg)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):  # pylint: disable=arguments-differ
        dy, x, b = ctx.saved_tensors
        cfg = ctx.cfg
        d_dy = d_x = d_b = None
        if ctx.needs_input_grad[0]:
            d_dy = _run_kernel(1, x, b, g, cfg)
        if (ctx.needs_input_grad[1] or ctx.needs_input_grad[2]) and cfg.smooth:
            d_x = _run_kernel(2, x, b, g * dy, cfg)
            if ctx.needs_input_grad[2]:
                d_b = _bias_grad(d_x, cfg.dim).to(b.dtype)
        return d_dy, d_x, d_b, None


def _self_check(device: torch.device, dtype: torch.dtype, cfg: _CudaConfig, has_bias: bool,
                ndim: int) -> Tuple[float, str]:
    """The kernel against the reference for one configuration (see kernel_choice).

    About 3,000 elements, in four ways: one launch of 16-byte vectors; one block, so that the
    grid-stride loop runs (256 threads of at most 8 elements cover 2,048); launches of 328
    elements (chunks that start inside runs of one bias index); x one element past an aligned
    address (the scalar kernels).
    """
    generator = torch.Generator(device=device).manual_seed(0)
    shape = [5 if i == cfg.dim else 2 for i in range(ndim)]
    other = ndim - 1 if cfg.dim == 0 else 0  # an axis other than the bias axis, if there is one
    shape[other] *= math.ceil(3000 / math.prod(shape))
    x = (torch.randn(shape, generator=generator, device=device, dtype=torch.float64) * 2).to(dtype)
    b = torch.randn([x.shape[cfg.dim]], generator=generator, device=device,
                    dtype=torch.float64).to(dtype) if has_bias else None
    spec = activation_funcs[cfg.act]

    def kernel(max_blocks: int, max_chunk: int, misaligned: bool) -> Callable:
        launch = dataclasses.replace(cfg, max_blocks=max_blocks, max_chunk=max_chunk)
        if misaligned:
            return lambda x, b: _BiasActCuda.apply(x.new_empty([x.numel() + 1])[1:].view(x.shape).copy_(x), b, launch)
        return lambda x, b: _BiasActCuda.apply(x, b, launch)
    return kernel_choice.worst_of([kernel_choice.compare_to_reference(
        kernel(*variant), lambda x, b: _bias_act_ref(x, b, cfg.dim, spec, cfg.alpha, cfg.gain, cfg.clamp),
        [x, b], ['x', 'b']) for variant in [(0, 0, False), (1, 0, False), (0, 328, False), (0, 0, True)]])
