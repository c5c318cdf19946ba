"""ops/relu_pool_gradfix: torch's values and derivatives of every order, without the forward graph in the double backward."""

import pytest
import torch
import torch.nn.functional as F

from ops import conv2d_gradfix, relu_pool_gradfix
from tests.support.gradfix import higher_order_gradients  # noqa: F401 (an autouse fixture)

OPS = {  # name: (ours, torch's)
    'relu': (relu_pool_gradfix.relu, F.relu),
    'leaky_relu': (lambda x: relu_pool_gradfix.leaky_relu(x, 0.1), lambda x: F.leaky_relu(x, 0.1)),
    'avg_pool2x2': (relu_pool_gradfix.avg_pool2x2, lambda x: F.avg_pool2d(x, 2)),
}


def input_away_from_kinks(shape, seed=0):
    """float64 values with |x| >= 0.1: finite differences of the activations stay within one linear piece."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return x + 0.1 * x.sign()


@pytest.mark.parametrize('name', OPS)
def test_gradcheck_and_gradgradcheck(name):
    ours, _ = OPS[name]
    x = input_away_from_kinks([2, 3, 4, 6]).requires_grad_(True)
    assert torch.autograd.gradcheck(ours, (x,), eps=1e-6)
    assert torch.autograd.gradgradcheck(ours, (x,), eps=1e-6)


@pytest.mark.parametrize('name', OPS)
def test_values_and_third_order_gradients_equal_torch(name):
    """A GN-like chain: conv, op, conv; loss on ||grad_x f||; its gradient w.r.t. the weights, and that gradient's own gradient."""
    ours, reference = OPS[name]
    x = input_away_from_kinks([3, 2, 8, 8])
    results = []
    for op in (ours, reference):
        w1 = torch.randn([4, 2, 3, 3], generator=torch.Generator().manual_seed(1), dtype=torch.float64, requires_grad=True)
        w2 = torch.randn([1, 4, 3, 3], generator=torch.Generator().manual_seed(2), dtype=torch.float64, requires_grad=True)
        xr = x.clone().requires_grad_(True)
        y = op(F.conv2d(xr, w1, padding=1))
        f = F.conv2d(y, w2, padding=1).sum(dim=[1, 2, 3])
        g, = torch.autograd.grad(f.sum(), xr, create_graph=True)
        loss = (f / (g.flatten(1).norm(dim=1) + f.abs())).sum()
        dw1, dw2 = torch.autograd.grad(loss, [w1, w2], create_graph=True)
        ddw1, = torch.autograd.grad(dw2.square().sum(), w1)
        results.append([y.detach(), g.detach(), dw1.detach(), dw2.detach(), ddw1])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('name', OPS)
def test_double_backward_does_not_reach_the_forward_input(name):
    """d/dx of the input gradient is zero for these ops; ours leaves the forward graph out instead of sending zeros into it."""
    ours, reference = OPS[name]
    for op, reaches_x in [(ours, False), (reference, True)]:
        x = input_away_from_kinks([2, 3, 4, 4]).requires_grad_(True)
        y = op(x)
        weights = torch.randn(y.shape, dtype=torch.float64, requires_grad=True)  # Stands for D's later layers.
        g, = torch.autograd.grad((y * weights).sum(), x, create_graph=True)
        second, dweights = torch.autograd.grad(g.square().sum(), [x, weights], allow_unused=True)
        assert dweights.abs().max() > 0
        assert (second is not None) == reaches_x, name
        if second is not None:
            assert second.abs().max() == 0  # torch's: an explicit tensor of zeros.


@pytest.mark.parametrize('name', OPS)
def test_channels_last_is_kept_in_every_order(name):
    ours, _ = OPS[name]
    x = input_away_from_kinks([2, 8, 4, 4]).to(memory_format=torch.channels_last).requires_grad_(True)
    y = ours(x)
    v = torch.randn(y.shape, dtype=torch.float64).to(memory_format=torch.channels_last).requires_grad_(True)
    g, = torch.autograd.grad(y, x, v, create_graph=True)
    gv, = torch.autograd.grad(g, v, torch.ones_like(g).to(memory_format=torch.channels_last))
    for t in (y, g, gv):
        assert t.is_contiguous(memory_format=torch.channels_last), name


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match='even H and W'):
        relu_pool_gradfix.avg_pool2x2(torch.zeros(1, 1, 3, 4))
    with pytest.raises(ValueError, match='negative_slope'):
        relu_pool_gradfix.leaky_relu(torch.zeros(2), 0.0)


@pytest.mark.parametrize('name, native_grad_fn', [('relu', 'ReluBackward0'), ('leaky_relu', 'LeakyReluBackward0'),
                                                  ('avg_pool2x2', 'AvgPool2DBackward0')])
def test_torchs_op_outside_higher_order_gradients(monkeypatch, name, native_grad_fn):
    """Outside conv2d_gradfix.higher_order_gradients() the op is PyTorch's own (same values, native backward)."""
    ours, reference = OPS[name]
    x = input_away_from_kinks([2, 3, 4, 6]).requires_grad_(True)
    monkeypatch.setattr(conv2d_gradfix, 'higher_order_active', False)
    y = ours(x)
    assert y.grad_fn.name() == native_grad_fn
    assert torch.equal(y, reference(x))
    with conv2d_gradfix.higher_order_gradients():
        assert ours(x).grad_fn.name() != native_grad_fn
