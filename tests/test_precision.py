"""training/step/precision.py: the TF32 switch, autocast and loss scaling of each --precision."""

import pytest
import torch

from training.step.precision import PRECISIONS, Precision


def test_tf32_allowed_for_each_precision():
    assert {name: Precision(name).allow_tf32 for name in PRECISIONS} == dict(tf32=True, fp32=False, bf16=True, fp16=True)
    with pytest.raises(ValueError, match='unknown precision "fp8"; valid: fp32, tf32, bf16, fp16'):
        Precision('fp8')


@pytest.mark.parametrize('name', PRECISIONS)
def test_run_computes_in_the_precision_and_returns_float32(name):
    net = torch.nn.Linear(16, 1)
    torch.manual_seed(0)
    x = torch.randn(8, 16)
    out = Precision(name).run(lambda x, c: net(x), x, None)
    assert out.dtype == torch.float32
    expected = {'bf16': torch.bfloat16, 'fp16': torch.float16}.get(name)
    if expected is None:  # Float32 forward: the exact float32 product.
        assert torch.equal(out, net(x))
    else:  # The matmul ran in the low-precision dtype: equal to it computed by hand in that dtype.
        by_hand = torch.nn.functional.linear(x.to(expected), net.weight.to(expected), net.bias.to(expected)).float()
        assert torch.equal(out, by_hand) and not torch.equal(out, net(x))


def test_grad_scaler_enabled_for_fp16_only():
    assert [Precision(name).grad_scaler('cpu').is_enabled() for name in PRECISIONS] == [False, False, False, True]


def test_lay_out_makes_cpu_weights_channels_last_and_keeps_values_and_parameters():
    """Precision.lay_out, where the networks are built for a run: channels-last 4-D weights on a CPU, the same values,
    the same Parameter objects (an optimizer built before still holds them)."""
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Linear(4, 2))
    before = {name: p.detach().clone() for name, p in net.named_parameters()}
    params = list(net.parameters())
    Precision('fp32').lay_out(net)
    assert net[0].weight.is_contiguous(memory_format=torch.channels_last) and not net[0].weight.is_contiguous()
    assert all(torch.equal(p, before[name]) for name, p in net.named_parameters())
    assert all(a is b for a, b in zip(params, net.parameters()))
