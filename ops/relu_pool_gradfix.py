"""ReLU, leaky ReLU and 2x2 average pooling whose derivatives of every order stay cheap.

A GN discriminator step differentiates D's input gradient, so the backward of every activation and
pooling layer is itself differentiated. PyTorch's own ops do that correctly but wastefully:

  * the backward of relu / leaky_relu, dx = m(y) * dy with the mask m(y) = 1 where y > 0 (else
    0, or the slope), is differentiated in y too, which is zero almost everywhere; PyTorch
    materializes that zero tensor and sends it back through the forward graph, where every
    convolution below runs once more on zeros;
  * avg_pool2d's backward zero-fills its output before scattering, and its double backward
    again returns a zero tensor for the (unused) input, in a memory layout of its own that later
    convolutions copy back to channels-last.

Here the backward of an activation is the linear map dy -> m(y) * dy with the mask held constant
(no gradient into y), and its backward is the same map, so derivatives of any order are masks.
2x2 average pooling is P(x) = avg_pool2d(x, 2); its adjoint is P^T(g) = upsample_nearest(g / 4), and
the adjoint of P^T is P again, so derivatives of any order alternate between the two, in the
layout of their input. Values and gradients equal torch's (the mask and the 1/4 are exact).

These autograd Functions are recorded only inside `ops.conv2d_gradfix.higher_order_gradients()`, the
passes that are differentiated twice; elsewhere `relu`, `leaky_relu` and `avg_pool2x2` are PyTorch's
own ops (no Python per backward), with the same values and first derivatives.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ops import conv2d_gradfix

#----------------------------------------------------------------------------


def relu(x: torch.Tensor) -> torch.Tensor:
    """torch.nn.functional.relu(x)."""
    if not conv2d_gradfix.higher_order_active or conv2d_gradfix.functorch_active():
        return torch.relu(x)
    return _activation_apply(x, 0.0)


def leaky_relu(x: torch.Tensor, negative_slope: float) -> torch.Tensor:
    """torch.nn.functional.leaky_relu(x, negative_slope), for 0 < negative_slope < 1."""
    if not 0 < negative_slope < 1:
        raise ValueError(f'leaky_relu: negative_slope must lie in (0, 1), got {negative_slope}')
    if not conv2d_gradfix.higher_order_active or conv2d_gradfix.functorch_active():
        return F.leaky_relu(x, negative_slope)
    return _activation_apply(x, float(negative_slope))


def avg_pool2x2(x: torch.Tensor) -> torch.Tensor:
    """torch.nn.functional.avg_pool2d(x, 2) for an [N, C, H, W] input with even H and W."""
    if x.ndim != 4 or x.shape[2] % 2 or x.shape[3] % 2:
        raise ValueError(f'avg_pool2x2: expected [N, C, H, W] with even H and W, got {list(x.shape)}')
    if not conv2d_gradfix.higher_order_active or conv2d_gradfix.functorch_active():
        return F.avg_pool2d(x, 2)
    return _avg_pool_apply(x)

#----------------------------------------------------------------------------


class _Activation(torch.autograd.Function):
    """y = x where x > 0, else negative_slope * x."""

    @staticmethod
    def forward(ctx, x, negative_slope):  # pylint: disable=arguments-differ
        y = torch.relu(x) if negative_slope == 0 else F.leaky_relu(x, negative_slope)
        ctx.save_for_backward(y)
        ctx.negative_slope = negative_slope
        return y

    @staticmethod
    def backward(ctx, grad):  # pylint: disable=arguments-differ
        y, = ctx.saved_tensors
        # The mask enters detached: no graph edge back into the forward pass (its derivative is zero a.e.).
        return _mask_apply(grad, y.detach(), ctx.negative_slope), None


class _Mask(torch.autograd.Function):
    """grad -> m(y) * grad, linear in grad for a fixed y (which gets no gradient)."""

    @staticmethod
    def forward(ctx, grad, y, negative_slope):  # pylint: disable=arguments-differ
        # y is detached (no graph, so no reference cycle): an attribute, without save_for_backward's Python.
        ctx.y, ctx.negative_slope = y, negative_slope
        # m(y) * grad with m = 1 where the activation's output y > 0, else negative_slope (y > 0 iff x > 0).
        if negative_slope == 0:
            return torch.ops.aten.threshold_backward(grad, y, 0)
        return torch.ops.aten.leaky_relu_backward(grad, y, negative_slope, True)

    @staticmethod
    def backward(ctx, grad2):  # pylint: disable=arguments-differ
        return _mask_apply(grad2, ctx.y, ctx.negative_slope), None, None


class _AvgPool2x2(torch.autograd.Function):
    """P(x) = avg_pool2d(x, 2); backward P^T."""

    @staticmethod
    def forward(ctx, x):  # pylint: disable=arguments-differ
        return F.avg_pool2d(x, 2)

    @staticmethod
    def backward(ctx, grad):  # pylint: disable=arguments-differ
        return _avg_pool_adjoint_apply(grad)


class _AvgPool2x2Adjoint(torch.autograd.Function):
    """P^T(g) = upsample_nearest(g / 4): each pooled gradient spread evenly over its 2x2 inputs; backward P."""

    @staticmethod
    def forward(ctx, grad):  # pylint: disable=arguments-differ
        return F.interpolate(grad * 0.25, scale_factor=2, mode='nearest')

    @staticmethod
    def backward(ctx, grad2):  # pylint: disable=arguments-differ
        return _avg_pool_apply(grad2)


_activation_apply = conv2d_gradfix.direct_apply(_Activation)
_mask_apply = conv2d_gradfix.direct_apply(_Mask)
_avg_pool_apply = conv2d_gradfix.direct_apply(_AvgPool2x2)
_avg_pool_adjoint_apply = conv2d_gradfix.direct_apply(_AvgPool2x2Adjoint)
