"""conv2d_gradfix: values, gradients of first and second order, weight-gradient skipping."""

import pytest
import torch
import torch.nn.functional as F

from ops import conv2d_gradfix
from tests.support.gradfix import higher_order_gradients  # noqa: F401 (an autouse fixture)

CONV_CASES = [  # input shape, weight shape, kwargs
    ([1, 4, 5, 6], [4, 2, 3, 3], dict(stride=2, padding=1, groups=2)),
    ([1, 3, 6, 5], [2, 3, 2, 3], dict(stride=(1, 2), padding=(0, 2), dilation=(2, 1))),
    ([2, 2, 5, 5], [3, 2, 1, 1], dict()),
]
TRANSPOSE_CASES = [
    ([1, 4, 3, 3], [4, 1, 3, 3], dict(stride=2, padding=1, output_padding=1, groups=2)),
    ([1, 3, 3, 4], [3, 2, 2, 3], dict(stride=(2, 1), padding=(0, 1), dilation=(1, 2))),
]


def _double(shape, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, dtype=torch.float64, generator=generator, requires_grad=True)


@pytest.mark.parametrize('x_shape, w_shape, kwargs', CONV_CASES)
def test_conv2d_gradcheck_and_gradgradcheck(x_shape, w_shape, kwargs):
    x, w, b = _double(x_shape, 0), _double(w_shape, 1), _double([w_shape[0]], 2)
    fn = lambda x, w, b: conv2d_gradfix.conv2d(x, w, b, **kwargs)  # noqa: E731
    torch.testing.assert_close(fn(x, w, b), F.conv2d(x, w, b, **kwargs))
    assert torch.autograd.gradcheck(fn, [x, w, b])
    assert torch.autograd.gradgradcheck(fn, [x, w, b], fast_mode=True)


@pytest.mark.parametrize('x_shape, w_shape, kwargs', TRANSPOSE_CASES)
def test_conv_transpose2d_gradcheck_and_gradgradcheck(x_shape, w_shape, kwargs):
    groups = kwargs.get('groups', 1)
    x, w, b = _double(x_shape, 0), _double(w_shape, 1), _double([w_shape[1] * groups], 2)
    fn = lambda x, w, b: conv2d_gradfix.conv_transpose2d(x, w, b, **kwargs)  # noqa: E731
    torch.testing.assert_close(fn(x, w, b), F.conv_transpose2d(x, w, b, **kwargs))
    assert torch.autograd.gradcheck(fn, [x, w, b])
    assert torch.autograd.gradgradcheck(fn, [x, w, b], fast_mode=True)


def test_third_order_matches_native():
    """Derivatives of any order: the third derivative of a smooth function of the conv agrees
    with PyTorch's native autograd (an independent implementation of the same derivatives)."""
    x, w = _double([1, 2, 5, 5], 0), _double([3, 2, 3, 3], 1)

    def third(conv):
        y = conv(x, w, stride=2, padding=1)
        g1, = torch.autograd.grad((y ** 3).sum(), x, create_graph=True)
        g2, = torch.autograd.grad((g1 ** 2).sum(), x, create_graph=True)
        return torch.autograd.grad((g2 * x).sum(), [x, w])

    for ours, native in zip(third(conv2d_gradfix.conv2d), third(F.conv2d)):
        torch.testing.assert_close(ours, native)


def test_gradient_norm_penalty_matches_native():
    """The GN/R1 pattern: input gradient with create_graph, a penalty on its norm, backward to the weights."""
    x, w1, w2 = _double([2, 3, 6, 6], 0), _double([4, 3, 3, 3], 1), _double([1, 4, 3, 3], 2)

    def weight_grads(conv, conv_t):
        h = F.leaky_relu(conv(x, w1, padding=1), 0.2)
        out = conv_t(h, w2.transpose(0, 1), stride=2, padding=1, output_padding=1).sum()
        grad_x, = torch.autograd.grad(out, x, create_graph=True)
        return torch.autograd.grad(grad_x.square().sum().sqrt() + out, [w1, w2])

    ours = weight_grads(conv2d_gradfix.conv2d, conv2d_gradfix.conv_transpose2d)
    native = weight_grads(F.conv2d, F.conv_transpose2d)
    for a, b in zip(ours, native):
        torch.testing.assert_close(a, b)


def test_no_weight_gradients():
    x, w, b = _double([1, 2, 5, 5], 0), _double([3, 2, 3, 3], 1), _double([3], 2)
    y = conv2d_gradfix.conv2d(x, w, b, padding=1)
    with conv2d_gradfix.no_weight_gradients():
        grad_x, grad_w, grad_b = torch.autograd.grad(y.sum(), [x, w, b], allow_unused=True, retain_graph=True)
    assert grad_w is None
    torch.testing.assert_close(grad_x, torch.autograd.grad(F.conv2d(x, w, b, padding=1).sum(), x)[0])
    torch.testing.assert_close(grad_b, torch.full_like(b, 25.0))  # 5x5 output pixels per channel
    assert not conv2d_gradfix.weight_gradients_disabled  # restored on exit
    grad_w, = torch.autograd.grad(y.sum(), w)
    assert grad_w is not None and grad_w.abs().sum() > 0


def test_input_gradient_alone_skips_weight_gradient(monkeypatch):
    calls = []
    original = conv2d_gradfix._Conv2dWeightGrad.forward
    monkeypatch.setattr(conv2d_gradfix._Conv2dWeightGrad, 'forward',
                        staticmethod(lambda *args: calls.append(1) or original(*args)))
    x, w = _double([1, 2, 5, 5], 0), _double([3, 2, 3, 3], 1)
    scaled_w = w * 0.5  # a computed weight, as with equalized learning rate or spectral norm
    torch.autograd.grad(conv2d_gradfix.conv2d(x, scaled_w, padding=1).sum(), x)
    assert not calls
    torch.autograd.grad(conv2d_gradfix.conv2d(x, scaled_w, padding=1).sum(), [x, w])
    assert len(calls) == 1


def test_disabled_and_string_padding_fall_back_to_torch(monkeypatch):
    x, w = _double([1, 2, 5, 5], 0), _double([3, 2, 3, 3], 1)
    y = conv2d_gradfix.conv2d(x, w, padding='same')
    assert y.grad_fn.name() != '_Conv2dBackward' and y.shape == (1, 3, 5, 5)
    monkeypatch.setattr(conv2d_gradfix, 'enabled', False)
    y = conv2d_gradfix.conv2d(x, w, padding=1)
    assert y.grad_fn.name() != '_Conv2dBackward'
    torch.testing.assert_close(y, F.conv2d(x, w, padding=1))


@pytest.mark.parametrize('op', ['conv2d', 'conv_transpose2d'])
def test_torchs_op_outside_higher_order_gradients(monkeypatch, op):
    """Outside the context the call records PyTorch's own convolution (same values); the context switches it
    on, nested contexts keep it on, and leaving restores what was there."""
    monkeypatch.setattr(conv2d_gradfix, 'higher_order_active', False)
    x, w = _double([1, 2, 5, 5], 0), _double([3, 2, 3, 3] if op == 'conv2d' else [2, 3, 3, 3], 1)
    conv, native = getattr(conv2d_gradfix, op), getattr(F, op)
    y = conv(x, w, padding=1)
    assert y.grad_fn.name() == 'ConvolutionBackward0'
    assert torch.equal(y, native(x, w, padding=1))
    with conv2d_gradfix.higher_order_gradients():
        with conv2d_gradfix.higher_order_gradients(enable=False):
            assert conv(x, w, padding=1).grad_fn.name() == '_Conv2dBackward'
        assert conv(x, w, padding=1).grad_fn.name() == '_Conv2dBackward'
    assert not conv2d_gradfix.higher_order_active
    assert conv(x, w, padding=1).grad_fn.name() == 'ConvolutionBackward0'
