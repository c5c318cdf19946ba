"""training/step/precision.py: the TF32 switch, autocast and loss scaling of each --precision."""

import json

import pytest
import torch

from bench.precision import cpu_isas
from tests.support.runs import run_clis
from training.networks import sngan
from training.step.loss import GANLoss
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


#----------------------------------------------------------------------------
# GN's D step in bf16 on every oneDNN kernel set the CPU offers (docs/precision.md, "kernel sets").

GN_ROUNDING_BOUND = 2.5  # GN's bf16 D gradient at most this many times as far from float64 as the unnormalized D's.

# One process per ONEDNN_MAX_CPU_ISA (set before torch loads oneDNN): the relative L2 error of the bf16 D-step
# gradients of a narrow SN-GAN ResNet D against float64, under GN (the loss's default D step) and unconstrained.
_BF16_D_STEP = '''
import os, sys
if sys.argv[1] != 'default':
    os.environ['ONEDNN_MAX_CPU_ISA'] = sys.argv[1]
import copy, json, torch
from bench.precision import kernel_set
from training.networks import sngan
from training.step.loss import GANLoss

def d_gradient(G, D, norm, precision, batch):
    D.requires_grad_(True)
    GANLoss(G=G, D=D, norm=norm, precision=precision).accumulate_gradients('D', *batch)
    return torch.cat([p.grad.flatten() for p in D.parameters()]).double()

errors = {}
for norm in ('gn', 'none'):
    torch.manual_seed(0)
    G = sngan.ResNetGenerator(z_dim=32, img_resolution=32, img_channels=3, c_dim=0, ch=8)
    D = sngan.ResNetDiscriminator(img_resolution=32, img_channels=3, c_dim=0, ch=8)
    batch = [torch.rand(4, 3, 32, 32) * 2 - 1, torch.zeros(4, 0), torch.randn(4, 32), torch.zeros(4, 0)]
    ref = d_gradient(copy.deepcopy(G).double(), copy.deepcopy(D).double(), norm, 'fp32', [t.double() for t in batch])
    got = d_gradient(G, D, norm, 'bf16', batch)
    errors[norm] = ((got - ref).norm() / ref.norm()).item()
print(json.dumps(dict(errors, kernels=kernel_set())))
'''


def test_gn_bf16_d_gradient_within_bound_on_every_kernel_set():
    isas = cpu_isas() or ['default']  # Not an x86 Linux CPU: its one kernel set.
    results = run_clis(*[['-c', _BF16_D_STEP, isa] for isa in isas])
    for isa, result in zip(isas, results):
        errors = json.loads(result.stdout.strip().splitlines()[-1])
        assert 0 < errors['gn'] <= GN_ROUNDING_BOUND * errors['none'], (isa, errors)


def test_gn_d_step_differentiates_plainly_under_autocast():
    # The affine form takes all of D's gradient from the second backward through the first backward's rounded graph:
    # in float32 by default, under bf16 and fp16 only when asked for.
    G = sngan.ResNetGenerator(z_dim=32, img_resolution=32, img_channels=3, c_dim=0, ch=8)
    D = sngan.ResNetDiscriminator(img_resolution=32, img_channels=3, c_dim=0, ch=8)
    for name in PRECISIONS:
        assert (GANLoss(G=G, D=D, precision=name).bias_layers is not None) == (name in ('fp32', 'tf32')), name
        assert GANLoss(G=G, D=D, precision=name, linear_d=True).bias_layers is not None
