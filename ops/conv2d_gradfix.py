"""conv2d / conv_transpose2d with gradients of any order and optional weight-gradient skipping.

Gradient normalization and gradient penalties differentiate the input
gradient of D, so every convolution in D is differentiated twice. Here a
convolution y = A(x, w) (bilinear in input x and weight w) is an autograd
Function whose backward is expressed through the same Functions:

    dx = A_x^T(dy; w)    the adjoint in x: the transposed convolution (or the
                         convolution, for a transposed one) of dy with w
    dw = A_w^T(dy; x)    the weight gradient, bilinear in (dy, x)

and the weight gradient's own backward, for an incoming g shaped like w, is
    d/d(dy) <g, A_w^T(dy; x)> = A(x, g),   d/dx = A_x^T(dy; g),
again convolutions. So derivatives of every order stay within these ops.

These Functions cost Python per call and per backward (a Function object, a
config, nested `apply` calls), which on a GPU is what a small network's step is
bound by, and they are only needed where a second derivative is taken. So
`conv2d` and `conv_transpose2d` run torch.nn.functional's convolutions unless
called inside `with higher_order_gradients():`, which the loss opens around the
passes that it differentiates twice (GN's D step, the exact GN G step,
gradient penalties); ops/relu_pool_gradfix.py follows the same switch. Which
op a call records is decided at the forward pass: a backward run later,
outside the context, goes through whatever the forward recorded.

Inside `with no_weight_gradients():` backward passes skip dw entirely, which
saves a convolution per layer when only input gradients are wanted (the
gradient penalty's grad of D w.r.t. images).
"""

import contextlib
import dataclasses
import functools
from typing import Any, Callable, Iterator, Optional, Tuple, Union

import torch
import torch.nn.functional as F

enabled = True  # False: torch.nn.functional's convolutions even inside higher_order_gradients()
higher_order_active = False  # set by higher_order_gradients()
weight_gradients_disabled = False  # set by no_weight_gradients()

IntPair = Union[int, Tuple[int, int]]


@contextlib.contextmanager
def higher_order_gradients(enable: bool = True) -> Iterator[None]:
    """Within this context (when `enable`), the convolutions here and the activations and pooling of
    ops/relu_pool_gradfix record the autograd Functions whose derivatives of every order are cheap; outside,
    PyTorch's own ops (the same values)."""
    global higher_order_active  # pylint: disable=global-statement
    previous = higher_order_active
    higher_order_active = previous or enable
    try:
        yield
    finally:
        higher_order_active = previous


@contextlib.contextmanager
def no_weight_gradients(disable: bool = True) -> Iterator[None]:
    """Within this context, backward passes through these convolutions skip weight gradients."""
    global weight_gradients_disabled  # pylint: disable=global-statement
    previous = weight_gradients_disabled
    if disable:
        weight_gradients_disabled = True
    try:
        yield
    finally:
        weight_gradients_disabled = previous


def conv2d(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, stride: IntPair = 1,
           padding: IntPair = 0, dilation: IntPair = 1, groups: int = 1) -> torch.Tensor:
    """torch.nn.functional.conv2d; inside higher_order_gradients() (integer padding) the custom autograd op."""
    if not (higher_order_active and enabled) or isinstance(padding, str) or functorch_active():
        return F.conv2d(input, weight, bias, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return _conv2d_apply(input, weight, bias, _conv_config(False, stride, padding, 0, dilation, groups))


def conv_transpose2d(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                     stride: IntPair = 1, padding: IntPair = 0, output_padding: IntPair = 0, groups: int = 1,
                     dilation: IntPair = 1) -> torch.Tensor:
    """torch.nn.functional.conv_transpose2d; inside higher_order_gradients() the custom autograd op."""
    if not (higher_order_active and enabled) or functorch_active():
        return F.conv_transpose2d(input, weight, bias, stride=stride, padding=padding, output_padding=output_padding,
                                  groups=groups, dilation=dilation)
    return _conv2d_apply(input, weight, bias, _conv_config(True, stride, padding, output_padding, dilation, groups))


def direct_apply(function: type[torch.autograd.Function]) -> Callable[..., Any]:
    """`function.apply` without its Python preamble, for Functions without setup_context.

    Function.apply binds default arguments for a setup_context and unwraps dead functorch wrappers
    (which exist only under torch.func transforms) before it calls the C++ entry point: about seven
    Python calls per apply, several hundred per GN D step. This is that entry point. Under a
    torch.func transform (`functorch_active()`) the ops here and in relu_pool_gradfix take PyTorch's
    own ops instead, so these Functions never meet a functorch wrapper."""
    return super(torch.autograd.Function, function).apply


functorch_active = torch._C._are_functorch_transforms_active  # pylint: disable=protected-access


@functools.lru_cache(maxsize=None)  # One config per layer setting; a cache hit runs no Python.
def _conv_config(transpose: bool, stride: IntPair, padding: IntPair, output_padding: IntPair, dilation: IntPair,
                 groups: int) -> '_ConvConfig':
    return _ConvConfig(transpose=transpose, stride=_pair(stride), padding=_pair(padding),
                       output_padding=_pair(output_padding), dilation=_pair(dilation), groups=groups)


def _pair(value: IntPair) -> Tuple[int, int]:
    if isinstance(value, int):
        return value, value
    first, second = value
    return int(first), int(second)


@dataclasses.dataclass(frozen=True, eq=False)  # Identity hash (no Python per lookup): configs come from caches.
class _ConvConfig:
    transpose: bool  # False: conv2d, True: conv_transpose2d
    stride: Tuple[int, int]  # (height, width) as in torch
    padding: Tuple[int, int]
    output_padding: Tuple[int, int]  # transposed convolutions only
    dilation: Tuple[int, int]
    groups: int

    @functools.lru_cache(maxsize=None)  # Per (config, shapes): the backward passes of a network reuse a few.
    def input_adjoint(self, input_shape: torch.Size, weight_shape: torch.Size) -> '_ConvConfig':
        """The convolution that maps output gradients to input gradients: conv2d <-> conv_transpose2d.

        For conv2d, the transposed convolution may round the size down (a
        strided conv2d ignores trailing input rows); output_padding restores
        input_shape exactly:
            H_in = (H_out - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1.
        """
        if self.transpose:
            return dataclasses.replace(self, transpose=False, output_padding=(0, 0))
        output_padding = []
        for axis in range(2):
            in_size, k = input_shape[axis + 2], weight_shape[axis + 2]
            s, p, d = self.stride[axis], self.padding[axis], self.dilation[axis]
            out_size = (in_size + 2 * p - d * (k - 1) - 1) // s + 1
            output_padding.append(in_size - ((out_size - 1) * s - 2 * p + d * (k - 1) + 1))
        return dataclasses.replace(self, transpose=True, output_padding=tuple(output_padding))


class _Conv2d(torch.autograd.Function):
    """y = A(x, w) + b for A = conv2d or conv_transpose2d, per cfg."""

    @staticmethod
    def forward(ctx, input, weight, bias, cfg):  # pylint: disable=arguments-differ
        ctx.cfg = cfg
        ctx.save_for_backward(input, weight)
        if cfg.transpose:
            return F.conv_transpose2d(input, weight, bias, stride=cfg.stride, padding=cfg.padding,
                                      output_padding=cfg.output_padding, groups=cfg.groups, dilation=cfg.dilation)
        return F.conv2d(input, weight, bias, stride=cfg.stride, padding=cfg.padding, dilation=cfg.dilation,
                        groups=cfg.groups)

    @staticmethod
    def backward(ctx, grad_output):  # pylint: disable=arguments-differ
        input, weight = ctx.saved_tensors
        cfg = ctx.cfg
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = _conv2d_apply(grad_output, weight, None, cfg.input_adjoint(input.shape, weight.shape))
        # The weight gradient: needs_input_grad only says that the weight requires grad. A gradient penalty asks
        # for torch.autograd.grad(D(x), x) alone; built-in ops then skip their weight gradients, and the engine can
        # tell us too, through the private hook torch.utils.checkpoint relies on. Where that hook is missing or
        # refuses (a leaf weight under autograd.grad), the weight gradient is computed (correct, only slower).
        weight_gradient_wanted = ctx.needs_input_grad[1] and not weight_gradients_disabled
        if weight_gradient_wanted:
            try:
                will_execute = torch._C._will_engine_execute_node  # pylint: disable=protected-access
                weight_gradient_wanted = will_execute(ctx.next_functions[1][0])
            except (AttributeError, RuntimeError, TypeError):
                pass
        if weight_gradient_wanted:
            grad_weight = _conv2d_weight_grad_apply(grad_output, input, weight.shape, cfg)
        if ctx.needs_input_grad[2]:
            grad_bias = grad_output.sum([0, 2, 3])
        return grad_input, grad_weight, grad_bias, None


class _Conv2dWeightGrad(torch.autograd.Function):
    """dw = A_w^T(dy; x): the weight gradient of y = A(x, w), as a differentiable function of (dy, x)."""

    @staticmethod
    def forward(ctx, grad_output, input, weight_shape, cfg):  # pylint: disable=arguments-differ
        ctx.cfg = cfg
        ctx.save_for_backward(grad_output, input)
        weight_like = input.new_empty(weight_shape)  # only its shape is read
        _, grad_weight, _ = torch.ops.aten.convolution_backward(
            grad_output, input, weight_like, None, list(cfg.stride), list(cfg.padding), list(cfg.dilation),
            cfg.transpose, list(cfg.output_padding), cfg.groups, [False, True, False])
        return grad_weight

    @staticmethod
    def backward(ctx, grad2_weight):  # pylint: disable=arguments-differ
        grad_output, input = ctx.saved_tensors
        cfg = ctx.cfg
        grad2_grad_output = grad2_input = None
        if ctx.needs_input_grad[0]:
            grad2_grad_output = _conv2d_apply(input, grad2_weight, None, cfg)
        if ctx.needs_input_grad[1]:
            adjoint = cfg.input_adjoint(input.shape, grad2_weight.shape)
            grad2_input = _conv2d_apply(grad_output, grad2_weight, None, adjoint)
        return grad2_grad_output, grad2_input, None, None


_conv2d_apply = direct_apply(_Conv2d)
_conv2d_weight_grad_apply = direct_apply(_Conv2dWeightGrad)
