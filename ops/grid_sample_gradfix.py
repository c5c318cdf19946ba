"""Bilinear grid sampling whose derivatives of every order with respect to the image stay exact and cheap.

For a fixed sampling grid, bilinear sampling with zero padding is linear in the image x:
    y = S(x),   S(x)[n, c, i, j] = sum_k w_k(grid[n, i, j]) * x[n, c, v_k, u_k]
over the four pixels (u_k, v_k) around the sampled point, with weights that depend on the grid alone. Its
gradient with respect to x is the adjoint S^T(dy) (a scatter with the same weights: aten's
grid_sampler_2d_backward with the image gradient only), and the adjoint of S^T is S again. So derivatives of
any order alternate between the two, as ops/relu_pool_gradfix.py does for pooling; the grid gets no gradient
(NVIDIA's augmentation draws it from random numbers). A gradient penalty or GN through the augmentation
(R1 on the real image before it is augmented) takes this second derivative; older torch releases have no
double backward for grid_sample at all.

The autograd Functions are recorded only inside `ops.conv2d_gradfix.higher_order_gradients()`, the passes that
are differentiated twice; elsewhere `grid_sample` is torch.nn.functional.grid_sample (mode 'bilinear', padding
'zeros', align_corners False: the only setting here), with the same values and first derivatives.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ops import conv2d_gradfix

#----------------------------------------------------------------------------


def grid_sample(input: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:  # pylint: disable=redefined-builtin
    """F.grid_sample(input, grid, mode='bilinear', padding_mode='zeros', align_corners=False) for an
    [N, C, H, W] input and an [N, H_out, W_out, 2] grid that takes no gradient."""
    if input.ndim != 4 or grid.ndim != 4:
        raise ValueError(f'grid_sample: expected a 4-D input and grid, got {list(input.shape)} and {list(grid.shape)}')
    if grid.requires_grad:
        raise ValueError('grid_sample: the grid must not require gradients')
    if not conv2d_gradfix.higher_order_active or conv2d_gradfix.functorch_active():
        return _sample(input, grid)
    return _GridSample.apply(input, grid)


def _sample(input: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:  # pylint: disable=redefined-builtin
    return F.grid_sample(input, grid, mode='bilinear', padding_mode='zeros', align_corners=False)


class _GridSample(torch.autograd.Function):
    """y = S(x) for the fixed grid."""

    @staticmethod
    def forward(ctx, input, grid):  # pylint: disable=arguments-differ
        ctx.save_for_backward(grid)
        ctx.input_shape = input.shape
        return _sample(input, grid)

    @staticmethod
    def backward(ctx, grad_output):  # pylint: disable=arguments-differ
        grid, = ctx.saved_tensors
        return _GridSampleAdjoint.apply(grad_output, grid, ctx.input_shape), None


class _GridSampleAdjoint(torch.autograd.Function):
    """dx = S^T(dy) for the fixed grid: the image gradient of S."""

    @staticmethod
    def forward(ctx, grad_output, grid, input_shape):  # pylint: disable=arguments-differ
        ctx.save_for_backward(grid)
        input_like = grad_output.new_empty(input_shape)  # only its shape is read for the image gradient
        grad_input, _ = torch.ops.aten.grid_sampler_2d_backward(grad_output, input_like, grid, 0, 0, False,
                                                                [True, False])  # bilinear, zeros, not aligned
        return grad_input

    @staticmethod
    def backward(ctx, grad2_input):  # pylint: disable=arguments-differ
        grid, = ctx.saved_tensors
        return _GridSample.apply(grad2_input, grid), None, None
