"""fma: values and gradients of first and second order, with broadcasting."""

import pytest
import torch

from ops import fma

SHAPES = [  # a, b, c: broadcasting along leading, inner and size-1 dimensions
    ([3, 4], [3, 4], [3, 4]),
    ([2, 3, 4], [4], [3, 1]),
    ([1, 4], [3, 1], [2, 3, 4]),
]


@pytest.mark.parametrize('a_shape, b_shape, c_shape', SHAPES)
def test_values_and_gradient_shapes(a_shape, b_shape, c_shape):
    torch.manual_seed(0)
    a, b, c = [torch.randn(s, dtype=torch.float64, requires_grad=True) for s in (a_shape, b_shape, c_shape)]
    y = fma.fma(a, b, c)
    torch.testing.assert_close(y, a.detach() * b.detach() + c.detach())
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, [a, b, c], dy)
    expected = torch.autograd.grad(a * b + c, [a, b, c], dy)  # PyTorch's own broadcasting rules
    for grad, exp, tensor in zip(grads, expected, (a, b, c)):
        assert grad.shape == tensor.shape
        torch.testing.assert_close(grad, exp)


@pytest.mark.parametrize('a_shape, b_shape, c_shape', SHAPES)
def test_gradcheck_and_gradgradcheck(a_shape, b_shape, c_shape):
    torch.manual_seed(0)
    inputs = [torch.randn(s, dtype=torch.float64, requires_grad=True) for s in (a_shape, b_shape, c_shape)]
    assert torch.autograd.gradcheck(fma.fma, inputs)
    assert torch.autograd.gradgradcheck(fma.fma, inputs)
