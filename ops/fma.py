"""Fused multiply-add a * b + c with broadcasting and gradients of every order."""

import torch


def fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """a * b + c in one kernel (torch.addcmul), broadcasting like the unfused expression.

    The fused op saves the intermediate a * b; the gradients
        d/da = dy * b,  d/db = dy * a,  d/dc = dy,
    each summed over the dimensions along which its operand was broadcast, are
    written with differentiable torch ops, so higher orders follow.
    """
    return _FusedMultiplyAdd.apply(a, b, c)


class _FusedMultiplyAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, c):  # pylint: disable=arguments-differ
        out = torch.addcmul(c, a, b)
        ctx.save_for_backward(a, b)
        ctx.c_shape = c.shape
        return out

    @staticmethod
    def backward(ctx, dout):  # pylint: disable=arguments-differ
        a, b = ctx.saved_tensors
        da = db = dc = None
        if ctx.needs_input_grad[0]:
            da = _unbroadcast(dout * b, a.shape)
        if ctx.needs_input_grad[1]:
            db = _unbroadcast(dout * a, b.shape)
        if ctx.needs_input_grad[2]:
            dc = _unbroadcast(dout, ctx.c_shape)
        return da, db, dc


def _unbroadcast(grad: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Sum grad over the dimensions that broadcasting added or expanded, giving back `shape`."""
    extra_dims = grad.ndim - len(shape)
    if extra_dims > 0:
        grad = grad.sum(list(range(extra_dims)))
    expanded = [i for i, size in enumerate(shape) if size == 1 and grad.shape[i] != 1]
    if expanded:
        grad = grad.sum(expanded, keepdim=True)
    return grad
