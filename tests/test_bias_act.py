"""bias_act against independently written formulas, and its first and second derivatives."""

import math

import pytest
import torch

from ops import bias_act

SELU_SCALE = 1.0507009873554804934193349852946
SELU_ALPHA = 1.6732632423543772848170429916717

# Each activation written out from its textbook definition, with StyleGAN2-ADA's defaults.
FORMULAS = {  # name: (formula(s, alpha), default alpha, default gain)
    'linear':   (lambda s, a: s,                                                           0.0, 1.0),
    'relu':     (lambda s, a: torch.where(s > 0, s, torch.zeros_like(s)),                  0.0, math.sqrt(2)),
    'lrelu':    (lambda s, a: torch.where(s > 0, s, a * s),                                0.2, math.sqrt(2)),
    'tanh':     (lambda s, a: (torch.exp(2 * s) - 1) / (torch.exp(2 * s) + 1),            0.0, 1.0),
    'sigmoid':  (lambda s, a: 1 / (1 + torch.exp(-s)),                                     0.0, 1.0),
    'elu':      (lambda s, a: torch.where(s > 0, s, a * (torch.exp(s) - 1)),               1.0, 1.0),
    'selu':     (lambda s, a: SELU_SCALE * torch.where(s > 0, s, SELU_ALPHA * (torch.exp(s) - 1)), 0.0, 1.0),
    'softplus': (lambda s, a: torch.log(1 + torch.exp(s)),                                 0.0, 1.0),
    'swish':    (lambda s, a: s / (1 + torch.exp(-s)),                                     0.0, math.sqrt(2)),
}


def _expected(x, b, dim, act, alpha, gain, clamp):
    formula, def_alpha, def_gain = FORMULAS[act]
    s = x if b is None else x + b.reshape([-1 if i == dim else 1 for i in range(x.ndim)])
    y = formula(s, def_alpha if alpha is None else alpha) * (def_gain if gain is None else gain)
    return y if clamp is None else torch.minimum(torch.maximum(y, torch.tensor(-clamp)), torch.tensor(clamp))


def test_activation_table_matches_formulas():
    assert set(bias_act.activation_funcs) == set(FORMULAS)
    for name, (_, def_alpha, def_gain) in FORMULAS.items():
        spec = bias_act.activation_funcs[name]
        assert (spec.def_alpha, spec.def_gain) == pytest.approx((def_alpha, def_gain))


@pytest.mark.parametrize('act', list(FORMULAS))
def test_matches_formula(act):
    torch.manual_seed(0)
    x = torch.randn([3, 4, 5, 6], dtype=torch.float64) * 3
    b = torch.randn([4], dtype=torch.float64)
    for bias, gain, clamp, alpha in [(b, None, None, None), (None, None, None, None), (b, 0.7, 0.5, None),
                                     (b, -1.3, 2.0, 0.3)]:
        y = bias_act.bias_act(x, bias, act=act, alpha=alpha, gain=gain, clamp=clamp)
        torch.testing.assert_close(y, _expected(x, bias, 1, act, alpha, gain, clamp), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('dim', [0, 2, -1])
def test_bias_dimension(dim):
    torch.manual_seed(0)
    x = torch.randn([3, 4, 5], dtype=torch.float64)
    b = torch.randn([x.shape[dim]], dtype=torch.float64)
    y = bias_act.bias_act(x, b, dim=dim, act='lrelu')
    torch.testing.assert_close(y, _expected(x, b, dim % x.ndim, 'lrelu', None, None, None))


def test_impl_cuda_on_cpu_is_reference():
    torch.manual_seed(0)
    x, b = torch.randn([2, 3, 4]), torch.randn([3])
    torch.testing.assert_close(bias_act.bias_act(x, b, act='swish', clamp=1.0),
                               bias_act.bias_act(x, b, act='swish', clamp=1.0, impl='ref'))


@pytest.mark.parametrize('act', list(FORMULAS))
def test_gradcheck_and_gradgradcheck(act):
    torch.manual_seed(0)
    # Keep inputs away from the kinks of relu/lrelu/elu/selu at 0 and from the clamp boundary,
    # where finite differences are not defined.
    x = torch.randn([2, 3, 4], dtype=torch.float64)
    x = (x + 0.2 * x.sign()).requires_grad_()
    b = torch.zeros([3], dtype=torch.float64, requires_grad=True)
    for clamp in (None, 1.25):
        fn = lambda x, b: bias_act.bias_act(x, b, act=act, clamp=clamp, gain=0.9)  # noqa: E731
        assert torch.autograd.gradcheck(fn, [x, b])
        assert torch.autograd.gradgradcheck(fn, [x, b], fast_mode=True)


def test_invalid_arguments_raise_clear_errors():
    x = torch.zeros([2, 3])
    with pytest.raises(ValueError, match='unknown activation'):
        bias_act.bias_act(x, act='gelu')
    with pytest.raises(ValueError, match='does not match'):
        bias_act.bias_act(x, torch.zeros([2]))
    with pytest.raises(ValueError, match='impl'):
        bias_act.bias_act(x, impl='triton')


def test_reference_path_keeps_the_most_recently_used_signatures(monkeypatch):
    """The checked dims per call signature are bounded (here to 2), least recently used out; values stay the formula's."""
    from torch_utils import kernel_choice
    monkeypatch.setattr(bias_act, '_checked_dims', kernel_choice.LruCache(size=2))
    for length in (3, 4, 3, 5):
        x, b = torch.randn([2, length], dtype=torch.float64), torch.randn([length], dtype=torch.float64)
        torch.testing.assert_close(bias_act.bias_act(x, b, act='lrelu'), _expected(x, b, 1, 'lrelu', None, None, None))
        assert len(bias_act._checked_dims) <= 2
    assert [key[0][1] for key in bias_act._checked_dims] == [3, 5]  # 3 was used again before 5 came, so 4 went.
