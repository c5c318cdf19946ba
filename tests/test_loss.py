"""GANLoss: adversarial losses, gradient penalties, CR, the fast G path and every --norm x --loss pair."""

import copy
import itertools

import numpy as np
import pytest
import torch
from torch import nn
import torch.nn.functional as F

import dnnlib
from torch_utils import devices, training_stats
from training.networks.biggan import BigGANDiscriminator, BigGANGenerator
from training.networks.sngan import CNNDiscriminator, CNNGenerator, ResNetDiscriminator, ResNetGenerator
from training.networks.stylegan import Discriminator as StyleGANDiscriminator
from training.recipes.configs import PRESETS, get_config
from training.step.augment import consistency_augment
from training.step.loss import CONSTRAINTS, LOSSES, NORMS, GANLoss, d_loss_terms, g_loss_terms

SHAPE = (2, 4, 4)


#----------------------------------------------------------------------------
# Adversarial loss terms against hand-written formulas.


def test_loss_terms_match_formulas():
    s = np.array([-1.5, -0.4, 0.0, 0.7, 2.0])
    real, fake = torch.tensor(s), torch.tensor(s[::-1].copy())
    softplus = lambda v: np.log1p(np.exp(v))
    p_real, p_fake = np.clip((s + 1) / 2, 0, 1), np.clip((s[::-1] + 1) / 2, 0, 1)  # Scores outside [-1, 1] saturate.
    log = lambda p: np.maximum(np.log(np.maximum(p, 1e-300)), -100)  # torch's BCE clamps its logs at -100.
    expected = {
        'hinge': (np.maximum(0, 1 - s), np.maximum(0, 1 + s[::-1]), -s[::-1]),
        'ns': (softplus(-s), softplus(s[::-1]), softplus(-s[::-1])),
        'ns-nosigmoid': (-log(p_real), -log(1 - p_fake), -log(p_fake)),
        'wasserstein': (-s, s[::-1], -s[::-1]),
    }
    for loss, (exp_real, exp_fake, exp_g) in expected.items():
        got_real, got_fake = d_loss_terms(loss, real, fake)
        np.testing.assert_allclose(got_real.numpy(), exp_real, rtol=1e-10, err_msg=loss)
        np.testing.assert_allclose(got_fake.numpy(), exp_fake, rtol=1e-10, err_msg=loss)
        np.testing.assert_allclose(g_loss_terms(loss, fake).numpy(), exp_g, rtol=1e-10, err_msg=loss)


def test_an_unknown_network_name_raises():
    G, D = nn.Identity(), nn.Identity()  # Unknown --loss and --norm: refused where the Experiment is built (test_configs).
    with pytest.raises(ValueError, match='network "both"'):
        GANLoss(G=G, D=D).accumulate_gradients('both', None, None, None, None)

#----------------------------------------------------------------------------
# Penalties and CR against direct computations with analytic discriminators.


class ReshapeG(nn.Module):
    """G(z, c) = z reshaped to images: fakes are known exactly."""

    def forward(self, z, c):
        return z.reshape(-1, *SHAPE)


class QuadraticD(nn.Module):
    """f(x) = 0.5 * sum(w * x^2) + b, so grad_x f = w * x and d/dw of any penalty is analytic."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.2, 1.5, int(np.prod(SHAPE)), dtype=torch.float64).reshape(SHAPE))
        self.b = nn.Parameter(torch.tensor(0.1, dtype=torch.float64))

    def forward(self, x, c):
        return (0.5 * self.w * x.square()).flatten(1).sum(1, keepdim=True) + self.b


def _batch(seed, n=5):
    g = torch.Generator().manual_seed(seed)
    real = torch.rand(n, *SHAPE, generator=g, dtype=torch.float64) * 2 - 1
    z = torch.rand(n, int(np.prod(SHAPE)), generator=g, dtype=torch.float64) * 2 - 1
    c = torch.zeros(n, 0, dtype=torch.float64)
    return real, c, z


@pytest.mark.parametrize('norm', ['gp1', 'gp0', 'r1'])
def test_gradient_penalties_match_direct_computation(norm):
    real, c, z = _batch(0)
    fake = z.reshape(-1, *SHAPE)
    D = QuadraticD()
    loss = GANLoss(G=ReshapeG(), D=D, loss='wasserstein', norm=norm, gp_weight=7.0, r1_gamma=3.0)
    torch.manual_seed(123)
    loss.accumulate_gradients('D', real, c, z, c)

    w = D.w.detach().numpy()
    xr, xf = real.numpy(), fake.numpy()
    grad_w = -np.mean(0.5 * xr**2, axis=0) + np.mean(0.5 * xf**2, axis=0)  # Wasserstein part.
    if norm == 'r1':
        grad_w += 3.0 * np.mean(w * xr**2, axis=0)  # d/dw of gamma/2 * mean ||w x||^2.
    else:
        torch.manual_seed(123)  # The interpolation weights are the step's only random draw.
        alpha = torch.rand(real.shape[0], 1, 1, 1, dtype=torch.float64).numpy()
        xm = alpha * xr + (1 - alpha) * xf
        n = np.sqrt(np.sum((w * xm)**2, axis=(1, 2, 3)))[:, None, None, None]
        if norm == 'gp1':  # d/dw of lambda * mean (||w x|| - 1)^2.
            grad_w += 7.0 * np.mean(2 * (n - 1) * w * xm**2 / n, axis=0)
        else:              # d/dw of lambda * mean ||w x||^2.
            grad_w += 7.0 * np.mean(2 * w * xm**2, axis=0)
    np.testing.assert_allclose(D.w.grad.numpy(), grad_w, rtol=1e-10)
    np.testing.assert_allclose(D.b.grad.item(), 0.0, atol=1e-12)


def test_r1_with_augmentation_differentiates_w_r_t_the_image_before_it():
    """--aug with R1 (NVIDIA's): the penalty's gradient is that of D(A(x)) w.r.t. x, by central differences in x with
    A's draws fixed (DiffAugment is affine in x for fixed draws, D quadratic: the differences are exact)."""
    from training.step.loss import r1_penalty
    real, c, z = _batch(0)
    D = QuadraticD()
    loss = GANLoss(G=ReshapeG(), D=D, norm='r1', r1_gamma=3.0, augment_kwargs=dict(aug='diffaug'))

    def f(x):
        torch.manual_seed(5)
        return D(loss.augment(x), c)[:, 0]
    torch.manual_seed(5)
    penalty, norm = r1_penalty(loss, real, c, None)
    grad, h = torch.zeros_like(real), 1e-3
    for j in range(real[0].numel()):
        e = torch.zeros_like(real[0]).flatten()
        e[j] = h
        grad.flatten(1)[:, j] = (f(real + e.reshape(real[0].shape)) - f(real - e.reshape(real[0].shape))) / (2 * h)
    expected = grad.flatten(1).norm(dim=1)
    torch.testing.assert_close(norm.flatten(), expected, rtol=1e-9, atol=0)
    torch.testing.assert_close(penalty.flatten(), 1.5 * expected ** 2, rtol=1e-9, atol=0)
    assert not torch.allclose(expected, (D.w * real).flatten(1).norm(dim=1))  # Not the gradient at x unaugmented.


class LinearConditionalD(nn.Module):
    """f(x, c) = <w, x> + <u, c>: the CR term cancels the label part only if both copies get the same label."""

    def __init__(self, c_dim):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(-1, 1, int(np.prod(SHAPE)), dtype=torch.float64).reshape(SHAPE))
        self.u = nn.Parameter(torch.arange(1.0, c_dim + 1, dtype=torch.float64))

    def forward(self, x, c):
        return (self.w * x).flatten(1).sum(1, keepdim=True) + (self.u * c).sum(1, keepdim=True)



def test_a_new_constraint_is_one_table_entry(monkeypatch):
    """A penalty added to CONSTRAINTS (here: lambda * mean D(real)^2, the 'drift' term of progressive GANs) is used by
    GANLoss with nothing else edited; train.py's --norm offers what the table holds."""
    import dataclasses
    import click
    import train
    from training.step import loss as loss_lib
    norm_option = next(p for p in train.main.params if p.name == 'norm')
    assert isinstance(norm_option.type, click.Choice) and tuple(norm_option.type.choices) == NORMS == tuple(CONSTRAINTS)

    def drift(loss, real_img, real_c, gen_img):
        f = loss.run_D(real_img, real_c)
        return 0.25 * f.square(), f.abs()
    monkeypatch.setitem(loss_lib.CONSTRAINTS, 'drift', dataclasses.replace(CONSTRAINTS['none'], penalty=drift))
    real, c, z = _batch(1)
    D = QuadraticD()
    GANLoss(G=ReshapeG(), D=D, loss='wasserstein', norm='drift').accumulate_gradients('D', real, c, z, c)
    xr, xf, w = real.numpy(), z.reshape(-1, *SHAPE).numpy(), D.w.detach().numpy()
    f = np.sum(0.5 * w * xr**2, axis=(1, 2, 3)) + 0.1
    grad_w = -np.mean(0.5 * xr**2, axis=0) + np.mean(0.5 * xf**2, axis=0) + 0.25 * np.mean(2 * f[:, None, None, None] * 0.5 * xr**2, axis=0)
    np.testing.assert_allclose(D.w.grad.numpy(), grad_w, rtol=1e-10)
    np.testing.assert_allclose(D.b.grad.item(), 0.25 * np.mean(2 * f), rtol=1e-10)


def test_consistency_regularization_matches_direct_computation():
    real, _, z = _batch(1, n=6)
    real_c = torch.eye(3, dtype=torch.float64)[torch.tensor([0, 1, 2, 0, 1, 2])]
    gen_c = torch.eye(3, dtype=torch.float64)[torch.tensor([2, 2, 1, 1, 0, 0])]
    D = LinearConditionalD(3)
    loss = GANLoss(G=ReshapeG(), D=D, loss='wasserstein', norm='none', cr=5.0)
    torch.manual_seed(7)
    loss.accumulate_gradients('D', real, real_c, z, gen_c)

    torch.manual_seed(7)  # The augmentation draws are the step's only random draws.
    aug = consistency_augment(real).numpy()
    w = D.w.detach().numpy()
    xr, xf = real.numpy(), z.reshape(-1, *SHAPE).numpy()
    diff = np.sum(w * (xr - aug), axis=(1, 2, 3))[:, None, None, None]  # f(real) - f(aug), same label.
    grad_w = -xr.mean(0) + xf.mean(0) + 5.0 * np.mean(2 * diff * (xr - aug), axis=0)
    grad_u = -real_c.numpy().mean(0) + gen_c.numpy().mean(0)  # No CR contribution: the labels cancel.
    np.testing.assert_allclose(D.w.grad.numpy(), grad_w, rtol=1e-10)
    np.testing.assert_allclose(D.u.grad.numpy(), grad_u, rtol=1e-10, atol=1e-12)


def test_gn_loss_uses_normalized_scores(monkeypatch):
    # Under GN, the D loss is the adversarial loss of f_hat = f / (||grad f|| + |f|); for the quadratic D
    # grad f = w x, so the expected loss value is computable in numpy.
    real, c, z = _batch(2)
    D = QuadraticD()
    reported = {}
    monkeypatch.setattr(training_stats, 'report', lambda name, value: reported.setdefault(name, value))
    GANLoss(G=ReshapeG(), D=D, loss='hinge', norm='gn').accumulate_gradients('D', real, c, z, c)
    w = D.w.detach().numpy()

    def f_hat(x):
        f = 0.5 * np.sum(w * x**2, axis=(1, 2, 3)) + 0.1
        return f / (np.linalg.norm((w * x).reshape(len(x), -1), axis=1) + np.abs(f))
    expected = np.mean(np.maximum(0, 1 - f_hat(real.numpy()))) + np.mean(np.maximum(0, 1 + f_hat(z.reshape(-1, *SHAPE).numpy())))
    np.testing.assert_allclose(reported['Loss/D/loss'].item(), expected, rtol=1e-10)
    np.testing.assert_allclose(reported['Loss/scores/real'].detach().numpy()[:, 0], f_hat(real.numpy()), rtol=1e-10)

#----------------------------------------------------------------------------
# Fast G path through GANLoss on the real (conditional) networks.


@pytest.mark.parametrize('nets,pairs', [
    ('resnet', [('hinge', 'gn'), ('ns-nosigmoid', 'gn1')]),
    ('cnn', [('ns', 'gn'), ('wasserstein', 'gn0')]),
    ('biggan', [('hinge', 'gn')]),
])
@pytest.mark.parametrize('augment', [None, dict(aug='fixed', p=0.8, augpipe='bgcfnc'), dict(aug='diffaug')])
def test_fast_generator_path_matches_exact_on_networks(nets, pairs, augment):
    """With --aug too: GN normalizes D at the augmented fakes, and the fast path rescales the gradient there, before
    it flows back through the augmentation (the same draws in both)."""
    torch.manual_seed(0)
    G_class, D_class, kwargs = {
        'resnet': (ResNetGenerator, ResNetDiscriminator, dict(ch=2)),
        'cnn': (CNNGenerator, CNNDiscriminator, dict(ch=2)),
        'biggan': (BigGANGenerator, BigGANDiscriminator, dict(ch=2)),
    }[nets]
    G = G_class(c_dim=3, img_resolution=32, img_channels=3, z_dim=16, **kwargs).double()
    D = D_class(c_dim=3, img_resolution=32, img_channels=3, **kwargs).double()
    assert D.is_piecewise_linear and GANLoss(G=G, D=D).fast_g
    z = torch.randn(3, 16, dtype=torch.float64)
    c = torch.eye(3, dtype=torch.float64)[torch.tensor([0, 2, 1])]
    for loss, norm in pairs:
        grads = []
        for fast in [False, True]:
            G_copy = copy.deepcopy(G)  # G's spectral-norm power iteration (BigGAN) advances on each call.
            torch.manual_seed(1)  # The same augmentation.
            GANLoss(G=G_copy, D=D, loss=loss, norm=norm, fast_g=fast, augment_kwargs=augment).accumulate_gradients(
                'G', None, None, z, c)
            grads.append(torch.cat([p.grad.flatten() for p in G_copy.parameters()]))
        exact, fast = grads
        assert exact.norm() > 0
        assert ((fast - exact).norm() / exact.norm()).item() < 1e-5, (loss, norm)


def test_fast_g_default_follows_piecewise_linearity():
    class SmoothD(nn.Module):
        is_piecewise_linear = False
    assert not GANLoss(G=nn.Identity(), D=SmoothD()).fast_g
    assert not GANLoss(G=nn.Identity(), D=nn.Identity()).fast_g
    with pytest.raises(ValueError, match='fast_g needs a piecewise-linear D'):
        GANLoss(G=nn.Identity(), D=SmoothD(), fast_g=True)
    assert GANLoss(G=nn.Identity(), D=SmoothD(), norm='sn', fast_g=True).fast_g  # Without GN it changes nothing.

#----------------------------------------------------------------------------
# The custom autograd ops of ops/ only in the passes that are differentiated twice.


@pytest.mark.parametrize('norm,net,fast_g,differentiated_twice', [
    ('none', 'D', None, False), ('sn', 'D', None, False), ('gn', 'D', None, True), ('gp1', 'D', None, True),
    ('r1', 'D', None, True), ('none', 'G', None, False), ('gn', 'G', True, False), ('gn', 'G', False, True)])
def test_custom_autograd_ops_only_where_differentiated_twice(norm, net, fast_g, differentiated_twice, monkeypatch):
    """The plain and SN D steps and the G steps without a second derivative record PyTorch's own ops only."""
    from ops import conv2d_gradfix, relu_pool_gradfix
    recorded = []
    for function in [conv2d_gradfix._Conv2d, relu_pool_gradfix._Activation, relu_pool_gradfix._AvgPool2x2]:
        def counted_forward(*args, _forward=function.forward, _name=function.__name__):
            recorded.append(_name)
            return _forward(*args)
        monkeypatch.setattr(function, 'forward', staticmethod(counted_forward))
    torch.manual_seed(0)
    D = ResNetDiscriminator(c_dim=0, img_resolution=32, img_channels=3, ch=2, spectral_norm=(norm == 'sn'))
    gan_loss = GANLoss(G=ImageG(32), D=D, norm=norm, fast_g=fast_g)
    real, z, c = torch.rand(2, 3, 32, 32) * 2 - 1, torch.randn(2, 3 * 32 * 32).requires_grad_(True), torch.zeros(2, 0)
    gan_loss.accumulate_gradients(net, real, c, z, c)
    if differentiated_twice:
        assert set(recorded) == {'_Conv2d', '_Activation', '_AvgPool2x2'}
    else:
        assert not recorded

#----------------------------------------------------------------------------
# Every --norm x --loss combination: one D step and one G step on CPU.


@pytest.mark.parametrize('norm,loss', list(itertools.product(NORMS, LOSSES)))
def test_every_combination_trains(norm, loss, monkeypatch):
    torch.manual_seed(0)
    G = CNNGenerator(c_dim=0, img_resolution=8, img_channels=3, z_dim=8, ch=2)
    D = CNNDiscriminator(c_dim=0, img_resolution=8, img_channels=3, ch=2, spectral_norm=(norm == 'sn'))
    gan_loss = GANLoss(G=G, D=D, loss=loss, norm=norm, cr=1.0)
    real = torch.rand(2, 3, 8, 8) * 2 - 1
    c = torch.zeros(2, 0)
    reported = {}
    monkeypatch.setattr(training_stats, 'report', lambda name, value: reported.setdefault(name, value))
    for phase, module, z in [('D', D, torch.randn(2, 8)), ('G', G, torch.randn(4, 8))]:
        before = [p.detach().clone() for p in module.parameters()]
        opt = torch.optim.Adam(module.parameters(), lr=1e-3)
        opt.zero_grad()
        gan_loss.accumulate_gradients(phase, real, c, z, torch.zeros(z.shape[0], 0))
        assert all(torch.isfinite(p.grad).all() for p in module.parameters() if p.grad is not None)
        opt.step()
        assert any(not torch.equal(a, p) for a, p in zip(before, module.parameters())), phase
    for name in ['Loss/D/loss', 'Loss/G/loss', 'Loss/D/real', 'Loss/D/fake', 'Loss/cr']:
        assert torch.isfinite(torch.as_tensor(reported[name])).all(), name
    if norm in ('gn', 'gn1', 'gn0', 'gp1', 'gp0', 'r1'):
        assert torch.isfinite(reported['Loss/grad_norm']).all()

#----------------------------------------------------------------------------
# One D call per D step: the same gradients as separate calls, for every preset's discriminator.

# (D class, resolution, loss) of every fixed-resolution preset, built narrow (same layers, fewer channels).
PRESET_DS = sorted({(get_config(name).D_kwargs.class_name, get_config(name).resolution, get_config(name).loss_kwargs.loss)
                    for name in PRESETS if 'resolution' in get_config(name)})


class ImageG(nn.Module):
    """G(z, c) = tanh(z) as images [N, 3, R, R]: fakes without a generator's cost."""

    def __init__(self, resolution):
        super().__init__()
        self.resolution = resolution

    def forward(self, z, c):
        return torch.tanh(z.reshape(-1, 3, self.resolution, self.resolution))


@pytest.mark.parametrize('class_name,resolution,loss', PRESET_DS)
def test_one_d_call_matches_separate_calls(class_name, resolution, loss):
    torch.manual_seed(0)
    n, c_dim = 3, 4
    real = torch.rand(n, 3, resolution, resolution, dtype=torch.float64) * 2 - 1
    z = torch.randn(n, 3 * resolution ** 2, dtype=torch.float64)
    real_c = torch.eye(c_dim, dtype=torch.float64)[torch.tensor([0, 3, 1])]
    gen_c = torch.eye(c_dim, dtype=torch.float64)[torch.tensor([2, 2, 0])]
    ch = 1 if resolution >= 128 else 2
    for norm, cr in [('gn', 5.0), ('none', 0.0), ('sn', 5.0), ('gp1', 0.0), ('r1', 5.0)]:
        D = dnnlib.util.construct_class_by_name(class_name=class_name, c_dim=c_dim, img_resolution=resolution,
                                                img_channels=3, ch=ch, spectral_norm=(norm == 'sn')).double()
        assert D.is_sample_independent and not GANLoss(G=ImageG(resolution), D=D).fuse_d_calls  # Default: only on CUDA.
        grads, calls = [], []
        for fuse in [True, False]:
            D_copy = copy.deepcopy(D)
            counter = []
            D_copy.register_forward_hook(lambda *args: counter.append(1))
            gan_loss = GANLoss(G=ImageG(resolution), D=D_copy, loss=loss, norm=norm, cr=cr, fuse_d_calls=fuse)
            torch.manual_seed(1)  # Same CR augmentation and GP interpolation in both runs.
            with torch.nn.utils.parametrize.cached():  # One SN power iteration per step in both (see the docstring).
                gan_loss.accumulate_gradients('D', real, real_c, z, gen_c)
            grads.append(torch.cat([p.grad.flatten() for p in D_copy.parameters() if p.grad is not None]))
            calls.append(len(counter))
        fused, separate = grads
        extra_calls = 1 if norm in ('gp1', 'r1', 'gn') else 0  # The penalty's own call; GN: the first step's affine check.
        assert calls == [1 + extra_calls, (3 if cr > 0 else 2) + extra_calls], (norm, calls)
        assert separate.norm() > 0
        torch.testing.assert_close(fused, separate, rtol=1e-10, atol=1e-12 * separate.abs().max().item())


@pytest.mark.parametrize('norm', ['gn', 'gn1', 'gn0'])
@pytest.mark.parametrize('fuse', [False, True])
@pytest.mark.parametrize('augment', [None, dict(aug='ada', p=0.8, augpipe='bgcfnc'), dict(aug='diffaug')])
def test_affine_d_step_matches_the_plain_one(norm, fuse, augment):
    """GANLoss's default D step (f in affine form) leaves the plain double backward's gradients, CR included, and with
    --aug (D's input is the augmented image, for fixed draws an affine image of x)."""
    resolution, c_dim = 32, 4
    D = ResNetDiscriminator(c_dim=c_dim, img_resolution=resolution, img_channels=3, ch=4).double()
    with torch.no_grad():
        for name, p in D.named_parameters():
            if name.endswith('bias'):
                p.normal_(0, 0.3)
    torch.manual_seed(0)
    real = torch.rand(3, 3, resolution, resolution, dtype=torch.float64) * 2 - 1
    z = torch.randn(3, 3 * resolution ** 2, dtype=torch.float64)
    real_c, gen_c = torch.eye(c_dim, dtype=torch.float64)[[0, 3, 1]], torch.eye(c_dim, dtype=torch.float64)[[2, 2, 0]]
    grads = []
    for linear_d in (None, False):
        D_copy = copy.deepcopy(D)
        gan_loss = GANLoss(G=ImageG(resolution), D=D_copy, norm=norm, cr=5.0, fuse_d_calls=fuse, linear_d=linear_d,
                           augment_kwargs=augment)
        assert (gan_loss.bias_layers is not None) == (linear_d is None)
        torch.manual_seed(1)  # Same CR augmentation (and --aug's).
        gan_loss.accumulate_gradients('D', real, real_c, z, gen_c)
        grads.append(torch.cat([p.grad.flatten() for p in D_copy.parameters()]))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-12 * grads[1].abs().max().item())


class TinyConvD(nn.Module):
    """A piecewise-linear, sample-independent D of conv and linear layers only (so GANLoss takes GN's affine form for
    it), on SHAPE images: 174 parameters, few enough for finite differences in every one."""
    is_piecewise_linear = is_sample_independent = True

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(SHAPE[0], 3, 3, padding=1)
        self.conv2 = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.out = nn.Linear(4, 1)

    def forward(self, x, c):
        h = F.leaky_relu(self.conv1(x), 0.2)
        h = F.leaky_relu(self.conv2(h), 0.2)
        return self.out(h.mean(dim=[2, 3]))


def gn_hinge_d_loss(D, real, fake, c, zeta) -> float:
    """The GN D step's loss, written out independently of training/step/: mean relu(1 - f_hat(real)) +
    mean relu(1 + f_hat(fake)), f_hat = f / (||grad_x f|| + zeta(f)), grad_x f by a first-order autograd.grad
    (no graph through it: only the value is needed here)."""
    total = 0.0
    for x, sign in ((real, 1), (fake, -1)):
        x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            f = D(x, c)
            grad, = torch.autograd.grad(f.sum(), x)
        f, n = f.detach()[:, 0], grad.flatten(1).norm(dim=1)
        f_hat = f / (n + (f.abs() if zeta == 'abs' else zeta))
        total += torch.relu(1 - sign * f_hat).mean().item()
    return total


@pytest.mark.parametrize('norm', ['gn', 'gn1', 'gn0'])
@pytest.mark.parametrize('linear_d', [None, False])  # The default affine form; the plain double backward.
def test_gn_d_step_parameter_gradients_match_finite_differences(norm, linear_d):
    """An oracle for D's parameter gradients in the GN D step, independent of how the step differentiates: float64
    central differences of the loss in each of D's parameters. It sees the loss's dependence on theta through
    ||grad_x f||, which a step that detached the norm (in normalize_gradient or in the affine form) would miss."""
    torch.manual_seed(0)
    D = TinyConvD().double()
    with torch.no_grad():
        for p in D.parameters():
            p.normal_(0, 0.5)  # Non-zero biases, so that the affine form's bias terms count.
    oracle_D = copy.deepcopy(D)
    real, c, z = _batch(7, n=4)
    gan_loss = GANLoss(G=ReshapeG(), D=D, loss='hinge', norm=norm, linear_d=linear_d)
    gan_loss.accumulate_gradients('D', real, c, z, c)
    assert (gan_loss.bias_layers is not None) == (linear_d is None)  # The affine form was used (checked, kept).
    computed = torch.cat([p.grad.flatten() for p in D.parameters()])

    fake, h = z.reshape(-1, *SHAPE), 1e-6
    expected = []
    with torch.no_grad():
        for p in oracle_D.parameters():
            flat = p.view(-1)
            for i in range(flat.numel()):
                flat[i] += h
                plus = gn_hinge_d_loss(oracle_D, real, fake, c, CONSTRAINTS[norm].gn_zeta)
                flat[i] -= 2 * h
                minus = gn_hinge_d_loss(oracle_D, real, fake, c, CONSTRAINTS[norm].gn_zeta)
                flat[i] += h
                expected.append((plus - minus) / (2 * h))
    expected = torch.tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(computed, expected, rtol=1e-6, atol=1e-7 * expected.abs().max().item())


def test_affine_d_step_is_checked_once_and_falls_back():
    class Shifted(nn.Module):  # Claims piecewise linearity, but adds a constant no bias layer carries.
        is_piecewise_linear = is_sample_independent = True

        def __init__(self):
            super().__init__()
            self.net = CNNDiscriminator(c_dim=0, img_resolution=32, img_channels=3, ch=2).double()

        def forward(self, x, c):
            return self.net(x, c) + 0.5

    real, z, c = torch.rand(2, 3, 32, 32, dtype=torch.float64), torch.randn(2, 3 * 32 * 32, dtype=torch.float64), torch.zeros(2, 0)
    grads = []
    for linear_d in (None, False):
        torch.manual_seed(0)
        D = Shifted()
        gan_loss = GANLoss(G=ImageG(32), D=D, linear_d=linear_d)
        if linear_d is None:
            assert gan_loss.bias_layers is not None
            with pytest.warns(UserWarning, match='affine form'):
                gan_loss.accumulate_gradients('D', real, c, z, c)
            assert gan_loss.bias_layers is None and gan_loss.linear_d_checked
        else:
            gan_loss.accumulate_gradients('D', real, c, z, c)
        grads.append(torch.cat([p.grad.flatten() for p in D.parameters()]))
    torch.testing.assert_close(grads[0], grads[1])  # Falling back gives the plain gradients.
    with pytest.raises(ValueError, match='linear_d'):
        GANLoss(G=nn.Identity(), D=StyleGANDiscriminator(c_dim=0, img_resolution=8, img_channels=3, fmap_base=16, fmap_max=4),
                linear_d=True)


class FunctionalHead(nn.Module):
    """Piecewise linear, but its last layer's bias is added by a functional call, outside the layer's forward: GN's
    affine form misses that term, and with the zero biases D starts from, nothing shows it but a non-zero bias."""
    is_piecewise_linear = is_sample_independent = True

    def __init__(self):
        super().__init__()
        self.net = CNNDiscriminator(c_dim=0, img_resolution=32, img_channels=3, ch=2)
        self.head = nn.Linear(1, 1)
        nn.init.zeros_(self.head.bias)

    def forward(self, x, c):
        return F.linear(self.net(x, c), self.head.weight, self.head.bias)


def test_affine_check_finds_a_bias_d_does_not_register():
    torch.manual_seed(0)
    D = FunctionalHead()
    gan_loss = GANLoss(G=ImageG(32), D=D)
    assert gan_loss.bias_layers is not None  # Its layers look linearizable.
    real, z, c = torch.rand(2, 3, 32, 32), torch.randn(2, 3 * 32 * 32), torch.zeros(2, 0)
    with pytest.warns(UserWarning, match='affine form'):
        gan_loss.accumulate_gradients('D', real, c, z, c)
    assert gan_loss.bias_layers is None and gan_loss.linear_d_checked
    assert not D.head.bias.any() and D.training  # The check worked on a copy: D is as it was.


@pytest.mark.parametrize('precision', ['tf32', 'fp32', 'bf16', 'fp16'])
@pytest.mark.parametrize('cfg', ['cifar10-cnn', 'cifar10-resnet', 'stl10-resnet', 'cifar10-biggan', 'celebahq128-resnet'])
def test_affine_check_keeps_every_shipped_discriminator(cfg, precision, recwarn):
    """Every preset's D passes the check at every precision (it is judged in float64, whatever the run's), where asked
    for under bf16 and fp16 (their default D step differentiates plainly: tests/test_precision.py)."""
    preset = get_config(cfg)
    c_dim = 10 if preset.conditional is True else 0
    torch.manual_seed(0)
    D = dnnlib.util.construct_class_by_name(**dict(preset.D_kwargs, c_dim=c_dim, img_channels=3, ch=2,  # Narrowed.
                                                   img_resolution=preset.resolution))
    gan_loss = GANLoss(G=nn.Identity(), D=D, precision=precision, linear_d=True)
    assert gan_loss.bias_layers is not None
    c = torch.eye(max(c_dim, 2))[[0, 1]][:, :c_dim]
    gan_loss._check_linear_d(torch.rand(2, 3, preset.resolution, preset.resolution) * 2 - 1, c)
    assert gan_loss.bias_layers is not None and not [w for w in recwarn if 'affine form' in str(w.message)]


def test_affine_check_does_not_advance_spectral_norm():
    """The one-time check runs D in eval mode: a GN step with an SN discriminator moves the power iteration as before."""
    D = ResNetDiscriminator(c_dim=0, img_resolution=32, img_channels=3, ch=2, spectral_norm=True).double()
    real, z, c = torch.rand(2, 3, 32, 32, dtype=torch.float64), torch.randn(2, 3 * 32 * 32, dtype=torch.float64), torch.zeros(2, 0)
    states = []
    for linear_d in (None, False):
        D_copy = copy.deepcopy(D)
        GANLoss(G=ImageG(32), D=D_copy, linear_d=linear_d).accumulate_gradients('D', real, c, z, c)
        states.append(torch.cat([v.flatten() for k, v in D_copy.state_dict().items() if k.endswith('_u')]))
    torch.testing.assert_close(states[0], states[1], rtol=0, atol=0)


def test_stylegan_d_is_called_per_batch():
    D = StyleGANDiscriminator(c_dim=0, img_resolution=8, img_channels=3, fmap_base=16, fmap_max=4)
    assert not D.is_sample_independent and not GANLoss(G=nn.Identity(), D=D).fuse_d_calls
    real, fake, c = torch.randn(4, 3, 8, 8), torch.randn(4, 3, 8, 8), torch.zeros(8, 0)
    assert not torch.allclose(D(torch.cat([real, fake]), c)[:4], D(real, c[:4]))  # Why: minibatch stddev mixes them.

#----------------------------------------------------------------------------
# Precision and gain.


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('norm', ['gn', 'none'])
def test_autocast_runs_networks_low_and_gn_and_losses_in_float32(dtype, norm, monkeypatch):
    torch.manual_seed(0)
    G = CNNGenerator(c_dim=0, img_resolution=8, img_channels=3, z_dim=8, ch=2)
    D = CNNDiscriminator(c_dim=0, img_resolution=8, img_channels=3, ch=2)
    conv_dtypes = []
    D.convs[1].register_forward_hook(lambda module, inputs, output: conv_dtypes.append(output.dtype))
    reported = {}
    monkeypatch.setattr(training_stats, 'report', lambda name, value: reported.setdefault(name, value))
    precision = {torch.bfloat16: 'bf16', torch.float16: 'fp16'}[dtype]
    gan_loss = GANLoss(G=G, D=D, loss='hinge', norm=norm, cr=1.0, precision=precision, fuse_d_calls=True)
    D.requires_grad_(True)
    gan_loss.accumulate_gradients('D', torch.rand(2, 3, 8, 8) * 2 - 1, torch.zeros(2, 0), torch.randn(2, 8),
                                  torch.zeros(2, 0))
    # Every call of D (reals, fakes, CR copies) in the autocast dtype; under autocast GN's D step differentiates
    # plainly, so no float64 copy checks the affine form (it would carry the hook along).
    assert conv_dtypes == [dtype] and gan_loss.bias_layers is None
    for name in ['Loss/scores/real', 'Loss/D/real', 'Loss/cr', 'Loss/D/loss'] + (['Loss/grad_norm'] if norm == 'gn' else []):
        assert reported[name].dtype == torch.float32, name
    assert all(p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all() for p in D.parameters())


@pytest.mark.parametrize('norm,fast_g', [('gn', True), ('gn', False), ('gp1', None), ('none', None)])
def test_gain_multiplies_gradients(norm, fast_g):
    torch.manual_seed(0)
    G = CNNGenerator(c_dim=0, img_resolution=8, img_channels=3, z_dim=8, ch=2).double()
    D = CNNDiscriminator(c_dim=0, img_resolution=8, img_channels=3, ch=2).double()
    real, c, z = torch.rand(2, 3, 8, 8, dtype=torch.float64) * 2 - 1, torch.zeros(2, 0), torch.randn(2, 8, dtype=torch.float64)
    for phase in ['D', 'G']:
        grads = []
        for gain in [1.0, torch.tensor(0.125, dtype=torch.float64)]:
            G_copy, D_copy = copy.deepcopy(G), copy.deepcopy(D)
            gan_loss = GANLoss(G=G_copy, D=D_copy, norm=norm, fast_g=fast_g)
            module = D_copy if phase == 'D' else G_copy
            module.requires_grad_(True)
            torch.manual_seed(1)
            gan_loss.accumulate_gradients(phase, real, c, z, c, gain=gain)
            grads.append(torch.cat([p.grad.flatten() for p in module.parameters() if p.grad is not None]))
        torch.testing.assert_close(grads[1], grads[0] * 0.125, rtol=1e-10, atol=0)


def test_precision_choices():
    with pytest.raises(ValueError, match='bf16'):
        GANLoss(G=nn.Identity(), D=nn.Identity(), precision='half')
    D = StyleGANDiscriminator(c_dim=0, img_resolution=8, img_channels=3, fmap_base=16, fmap_max=4)
    assert GANLoss(G=nn.Identity(), D=D, precision='tf32').precision.autocast_dtype is None
    assert GANLoss(G=nn.Identity(), D=D, precision='bf16').precision.autocast_dtype is torch.bfloat16


@pytest.mark.gpu
def test_affine_check_keeps_the_affine_path_on_a_gpu_with_tf32(recwarn):
    """With TF32 matmuls a float32 check missed the identity by ~1e-3 and dropped the affine path; float64 does not."""
    device = torch.device('cuda')
    torch.manual_seed(0)
    G = ResNetGenerator(c_dim=0, img_resolution=32, img_channels=3, ch=8).to(device)
    D = ResNetDiscriminator(c_dim=0, img_resolution=32, img_channels=3, ch=8).to(device)
    with devices.run_switches(device, allow_tf32=True):
        gan_loss = GANLoss(G=G, D=D, norm='gn', precision='tf32')
        real, z, c = torch.rand(8, 3, 32, 32, device=device) * 2 - 1, torch.randn(8, 128, device=device), torch.zeros(8, 0, device=device)
        gan_loss.accumulate_gradients('D', real, c, z, c)
    assert gan_loss.linear_d_checked and gan_loss.bias_layers is not None
    assert not [w for w in recwarn if 'affine form' in str(w.message)]


@pytest.mark.gpu
@pytest.mark.parametrize('norm', ['gn', 'gp1', 'r1'])
@pytest.mark.parametrize('augment', [None, dict(aug='ada', p=0.5, augpipe='bgcfnc'), dict(aug='diffaug')])
def test_steps_never_sync_the_gpu(norm, augment):
    """Neither the steps nor --aug's augmentations and ADA's adjustment of p read the GPU back."""
    device = torch.device('cuda')
    torch.manual_seed(0)
    G = CNNGenerator(c_dim=3, img_resolution=8, img_channels=3, z_dim=8, ch=2).to(device)
    D = CNNDiscriminator(c_dim=3, img_resolution=8, img_channels=3, ch=2).to(device)
    gan_loss = GANLoss(G=G, D=D, norm=norm, cr=1.0, precision='bf16', augment_kwargs=augment)
    real, z = torch.rand(4, 3, 8, 8, device=device) * 2 - 1, torch.randn(4, 8, device=device)
    c = torch.eye(3, device=device)[torch.tensor([0, 1, 2, 0], device=device)]
    gan_loss.accumulate_gradients('D', real, c, z, c)  # First calls may initialize CUDA libraries.
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        for phase in ['D', 'G']:
            gan_loss.accumulate_gradients(phase, real, c, z, c, gain=torch.ones([], device=device))
        if gan_loss.augment is not None:
            gan_loss.augment.adjust()
    finally:
        torch.cuda.set_sync_debug_mode('default')


#----------------------------------------------------------------------------
# StyleGAN2 (NVIDIA StyleGAN2-ADA's loss terms).


def _stylegan2_pair(c_dim=0):
    from training.networks import stylegan2  # pylint: disable=import-outside-toplevel
    torch.manual_seed(0)
    G = stylegan2.Generator(z_dim=8, c_dim=c_dim, w_dim=8, img_resolution=8, img_channels=1,
                            mapping_kwargs=dict(num_layers=2), synthesis_kwargs=dict(channel_base=32, channel_max=4))
    D = stylegan2.Discriminator(c_dim=c_dim, img_resolution=8, img_channels=1, channel_base=32, channel_max=4,
                                epilogue_kwargs=dict(mbstd_group_size=2))
    with torch.no_grad():  # Noise and biases off their zero init, so that every term shows.
        for name, p in G.named_parameters():
            if name.endswith('noise_strength') or name.endswith('.bias'):
                p.normal_()
    return G.double().train(), D.double().train()


def test_path_length_penalty_against_the_jacobian():
    """a_n = sqrt(mean_i ||J_ni^T y_n||^2) with the full Jacobian J of the image w.r.t. the styles (float64, computed
    with torch.autograd.functional.jacobian), pl_mean <- lerp(0, mean a, 0.01), penalty (a - pl_mean)^2 * weight,
    and its gradient w.r.t. a parameter by central differences of that formula."""
    G, D = _stylegan2_pair()
    loss = GANLoss(G, D, norm='none', pl_weight=2.0, pl_decay=0.01, pl_batch_shrink=2)
    z, c = torch.randn(4, 8, dtype=torch.float64), torch.zeros(4, 0, dtype=torch.float64)
    param = G.synthesis.b8.conv0.weight

    def formula(z2):  # The penalty by the Jacobian, with the loss's random draws (synthesis noise, then y).
        torch.manual_seed(5)
        ws = G.mapping(z2, None, skip_w_avg_update=True)
        noise_draws = torch.get_rng_state()
        synth = lambda w: (torch.set_rng_state(noise_draws), G.synthesis(w, noise_mode='random'))[1]
        img = synth(ws)
        y = torch.randn_like(img) / np.sqrt(8 * 8)
        J = torch.autograd.functional.jacobian(synth, ws, create_graph=True)  # [N, C, H, W, N, num_ws, w_dim]
        lengths = torch.stack([torch.einsum('chw,chwij->ij', y[n], J[n, :, :, :, n]).square().sum(dim=1).mean().sqrt()
                               for n in range(z2.shape[0])])
        pl_mean = torch.zeros([], dtype=torch.float64).lerp(lengths.mean(), 0.01)
        return (lengths - pl_mean).square().mean() * 2.0, pl_mean.detach()

    G.mapping.w_avg_beta = None  # Keep w_avg out of it (the loss's mapping call would move it).
    G.requires_grad_(True)
    torch.manual_seed(5)
    loss._path_length_backward(z, c, gain=1.0)
    grad = param.grad.clone()
    expected, pl_mean = formula(z[:2])
    assert float(loss.pl_mean) == pytest.approx(float(pl_mean), rel=1e-7)  # Kept in float32.
    torch.testing.assert_close(grad, torch.autograd.grad(expected, param)[0], rtol=1e-8, atol=1e-12)



@pytest.mark.parametrize('source', ['default', 'gn-stylegan2'])
def test_path_length_average_decays_by_nvidias_rate(source):
    """pl_mean <- lerp(pl_mean, mean a, decay) with NVIDIA's StyleGAN2Loss decay 0.01, by GANLoss's default and by the
    gn-stylegan2 preset: two updates with the same lengths m from 0 give p1 = d m and p2 = p1 + d (m - p1), so the decay
    is d = 2 - p2 / p1, whatever m is."""
    from training.experiment import Experiment
    G, D = _stylegan2_pair()
    kwargs = dict(norm='none', pl_weight=2.0)
    if source == 'gn-stylegan2':
        preset = Experiment.build(cfg='gn-stylegan2', img_resolution=8, img_channels=1).loss_kwargs
        kwargs = dict(preset, **kwargs, class_name='training.step.loss.GANLoss')
    else:
        kwargs = dict(kwargs, class_name='training.step.loss.GANLoss')
    loss = dnnlib.util.construct_class_by_name(**kwargs, G=G, D=D)
    G.mapping.w_avg_beta = None  # The same lengths in both calls: nothing of G moves.
    z, c = torch.randn(4, 8, dtype=torch.float64), torch.zeros(4, 0, dtype=torch.float64)
    averages = []
    for _ in range(2):
        torch.manual_seed(5)
        loss._path_length_backward(z, c, gain=1.0)
        averages.append(float(loss.pl_mean))
    assert averages[0] > 0 and 2 - averages[1] / averages[0] == pytest.approx(0.01, rel=1e-4)

def test_style_mixing_crossover():
    """With probability 1 every batch takes its first styles from z and its last from a second latent, switching once;
    with probability 0 none does; the second latent never moves w_avg."""
    G, D = _stylegan2_pair()
    z = torch.randn(3, 8, dtype=torch.float64)
    G.eval()
    own = G.mapping(z, None)
    for prob, seeds in [(1.0, range(8)), (0.0, range(2))]:
        loss = GANLoss(G, D, norm='none', style_mixing_prob=prob)
        for seed in seeds:
            torch.manual_seed(seed)
            ws = loss.run_G_styles(z, None)[1]
            from_z = (ws == own).all(dim=2).all(dim=0)  # [num_ws]
            if prob == 0:
                assert from_z.all()
            else:
                assert from_z[0] and not from_z[-1] and (from_z.int().diff() <= 0).all()
    G.train()
    w_avg = G.mapping.w_avg.clone()
    torch.manual_seed(0)
    GANLoss(G, D, norm='none', style_mixing_prob=1.0).run_G_styles(z, None)
    torch.testing.assert_close(G.mapping.w_avg, w_avg.lerp(G.mapping.eval()(z, None)[:, 0].mean(dim=0), 1 - 0.995))


def test_lazy_regularizers_are_phases_of_their_own_weighted_by_the_interval():
    """NVIDIA's phases: R1 every 16th D step and path length every 4th G step, each an optimizer step of its own
    after the main loss. The 'reg' phase's gradient is R1 with gamma * 16 alone (the gradient of the loss with R1
    every step less the loss without it), or the path length term's with weight * 4 alone (tested against the
    Jacobian above); the 'main' phase's is that of the loss without the term."""
    G, D = _stylegan2_pair()
    real, c = torch.randn(4, 1, 8, 8, dtype=torch.float64), torch.zeros(4, 0, dtype=torch.float64)
    z = torch.randn(4, 8, dtype=torch.float64)
    G.mapping.w_avg_beta = None  # Keep w_avg still: every call below starts from the same networks.

    def grads(net, phase, **kwargs):
        loss = GANLoss(G, D, **kwargs)
        loss.set_phase(net, phase)
        module = D if net == 'D' else G
        module.requires_grad_(True).zero_grad(set_to_none=True)
        torch.manual_seed(0)
        loss.accumulate_gradients(net, real, c, z, c)
        module.requires_grad_(False)
        return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in module.parameters()]

    lazy_r1 = dict(norm='r1', r1_gamma=0.5, D_reg_interval=16)
    reg, main = grads('D', 'reg', **lazy_r1), grads('D', 'main', **lazy_r1)
    with_r1, without_r1 = grads('D', 'both', norm='r1', r1_gamma=8.0), grads('D', 'both', norm='none')
    for a, b, m, n in zip(reg, with_r1, main, without_r1):
        torch.testing.assert_close(a, b - n)
        torch.testing.assert_close(m, n)
    lazy_pl = dict(norm='none', pl_weight=0.5, G_reg_interval=4)
    reg, main, without_pl = grads('G', 'reg', **lazy_pl), grads('G', 'main', **lazy_pl), grads('G', 'both', norm='none')
    G.requires_grad_(True).zero_grad(set_to_none=True)
    torch.manual_seed(0)
    GANLoss(G, D, norm='none', pl_weight=2.0)._path_length_backward(z, c, gain=1.0)
    G.requires_grad_(False)
    for a, p, m, n in zip(reg, G.parameters(), main, without_pl):
        torch.testing.assert_close(a, torch.zeros_like(p) if p.grad is None else p.grad)
        torch.testing.assert_close(m, n)
    assert any(a.abs().max() > 0 for a in reg)
    loss = GANLoss(G, D, pl_weight=0.5, G_reg_interval=4, **lazy_r1)
    assert [loss.phases('D', step) for step in (0, 1, 15, 16)] == [('main', 'reg'), ('main',), ('main',), ('main', 'reg')]
    assert [loss.phases('G', step) for step in (0, 3, 4)] == [('main', 'reg'), ('main',), ('main', 'reg')]
    # No lazy interval, or nothing to regularize: one phase.
    assert GANLoss(G, D, norm='r1').phases('D', 0) == ('both',)
    assert GANLoss(G, D, norm='gn', D_reg_interval=16, G_reg_interval=4).phases('G', 0) == ('both',)