"""Gradient normalization: the paper's bounds, its GN-0 / GN-1 variants, the no-NaN rule and the fast G path.

Reference gradients grad_x f come from central finite differences of the raw discriminator in
float64 (exact for a piecewise-linear f away from its kinks), not from the code under test.
"""

import copy

import numpy as np
import pytest
import torch
from torch import nn

from training.step.gradnorm import generator_backward_fast, normalize, normalize_gradient

SHAPE = (3, 6, 6)  # Input images [C, H, W].
NUM_CLASSES = 3


#----------------------------------------------------------------------------
# Small random discriminators, piecewise linear in x, optionally conditional (projection).


class MLP(nn.Module):
    def __init__(self, act, c_dim=0):
        super().__init__()
        d = int(np.prod(SHAPE))
        self.layers = nn.ModuleList([nn.Linear(d, 24), nn.Linear(24, 16)])
        self.act = act
        self.out = nn.Linear(16, 1)
        self.embed = nn.Linear(c_dim, 16, bias=False) if c_dim else None

    def forward(self, x, c=None):
        h = x.flatten(1)
        for layer in self.layers:
            h = self.act(layer(h))
        f = self.out(h)
        if self.embed is not None:
            f = f + (self.embed(c) * h).sum(1, keepdim=True)
        return f


class CNN(nn.Module):
    def __init__(self, act, c_dim=0):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv2d(SHAPE[0], 6, 3, padding=1), nn.Conv2d(6, 8, 4, stride=2, padding=1)])
        self.act = act
        self.out = nn.Linear(8, 1)
        self.embed = nn.Linear(c_dim, 8, bias=False) if c_dim else None

    def forward(self, x, c=None):
        h = x
        for conv in self.convs:
            h = self.act(conv(h))
        h = torch.nn.functional.avg_pool2d(h, h.shape[-1]).flatten(1)
        f = self.out(h)
        if self.embed is not None:
            f = f + (self.embed(c) * h).sum(1, keepdim=True)
        return f


ACTS = {'relu': nn.ReLU(), 'lrelu': nn.LeakyReLU(0.2)}
ARCHS = {'mlp': MLP, 'cnn': CNN}
CASES = [(arch, act) for arch in ARCHS for act in ACTS]


def make_D(arch, act, c_dim=0, seed=0):
    torch.manual_seed(seed)
    D = ARCHS[arch](ACTS[act], c_dim).double()
    with torch.no_grad():
        for p in D.parameters():
            p.normal_(0, 0.5)  # Nonzero biases too, so that f and grad f vary from sample to sample.
    return D


def fd_gradient(D, x, c=None, h=1e-6):
    """Central finite differences of D w.r.t. every input element, all perturbations in one batch."""
    N, d = x.shape[0], x[0].numel()
    eye = torch.eye(d, dtype=x.dtype).reshape(d, *x.shape[1:]) * h
    xp = (x[:, None] + eye[None]).reshape(N * d, *x.shape[1:])
    xm = (x[:, None] - eye[None]).reshape(N * d, *x.shape[1:])
    cc = None if c is None else c.repeat_interleave(d, dim=0)
    with torch.no_grad():
        diff = (D(xp, cc) - D(xm, cc)).reshape(N, d)
    return (diff / (2 * h)).numpy()

#----------------------------------------------------------------------------


@pytest.mark.parametrize('arch,act', CASES)
def test_gn_bounds_and_gradient(arch, act):
    D = make_D(arch, act)
    torch.manual_seed(1)
    x = torch.randn(8, *SHAPE, dtype=torch.float64, requires_grad=True)
    out = normalize_gradient(D, x)

    f = D(x).detach().numpy()[:, 0]
    g = fd_gradient(D, x.detach())
    n = np.linalg.norm(g, axis=1)
    np.testing.assert_allclose(out.grad_norm.detach().numpy()[:, 0], n, rtol=1e-6)
    f_hat = out.f_hat.detach().numpy()[:, 0]
    np.testing.assert_allclose(f_hat, f / (n + np.abs(f)), rtol=1e-6)
    assert np.all(np.abs(f_hat) <= 1)

    # Theorem: grad_x f_hat = n g / (n + |f|)^2, so ||grad_x f_hat|| = (n / (n + |f|))^2 <= 1.
    grad_hat, = torch.autograd.grad(out.f_hat.sum(), x)
    grad_hat = grad_hat.flatten(1).numpy()
    expected = (n / (n + np.abs(f))**2)[:, None] * g
    np.testing.assert_allclose(grad_hat, expected, rtol=1e-5, atol=1e-9)
    norms = np.linalg.norm(grad_hat, axis=1)
    assert np.all(norms <= 1 + 1e-5)
    np.testing.assert_allclose(norms, (n / (n + np.abs(f)))**2, rtol=1e-5)


@pytest.mark.parametrize('arch,act', CASES)
def test_gn0_and_gn1_variants(arch, act):
    D = make_D(arch, act)
    with torch.no_grad():
        D.out.bias.fill_(50.0)  # Large outputs with unchanged gradients: shows which variants bound |f_hat|.
    torch.manual_seed(2)
    x = torch.randn(8, *SHAPE, dtype=torch.float64, requires_grad=True)
    f = D(x).detach().numpy()[:, 0]
    g = fd_gradient(D, x.detach())
    n = np.linalg.norm(g, axis=1)

    # GN-0: f / ||grad f||: gradient norm exactly 1, output unbounded.
    out0 = normalize_gradient(D, x, zeta=0)
    np.testing.assert_allclose(out0.f_hat.detach().numpy()[:, 0], f / n, rtol=1e-6)
    assert np.abs(out0.f_hat.detach().numpy()).max() > 1
    grad0, = torch.autograd.grad(out0.f_hat.sum(), x)
    np.testing.assert_allclose(np.linalg.norm(grad0.flatten(1).numpy(), axis=1), 1.0, rtol=1e-6)

    # GN-1: f / (||grad f|| + 1): gradient norm n / (n + 1) < 1, output unbounded.
    out1 = normalize_gradient(D, x, zeta=1)
    np.testing.assert_allclose(out1.f_hat.detach().numpy()[:, 0], f / (n + 1), rtol=1e-6)
    assert np.abs(out1.f_hat.detach().numpy()).max() > 1
    grad1, = torch.autograd.grad(out1.f_hat.sum(), x)
    np.testing.assert_allclose(np.linalg.norm(grad1.flatten(1).numpy(), axis=1), n / (n + 1), rtol=1e-6)

    # GN stays bounded on the same discriminator.
    out = normalize_gradient(D, x)
    assert np.abs(out.f_hat.detach().numpy()).max() <= 1


@pytest.mark.parametrize('zeta', ['abs', 1, 0])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_all_zero_discriminator_is_finite(zeta, dtype):
    D = make_D('mlp', 'relu').to(dtype)
    with torch.no_grad():
        for p in D.parameters():
            p.zero_()
    x = torch.randn(4, *SHAPE, dtype=dtype, requires_grad=True)
    out = normalize_gradient(D, x, zeta=zeta)
    assert torch.all(out.f_hat == 0)
    (out.f_hat.sum() + out.f_hat.square().sum()).backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in D.parameters())


@pytest.mark.parametrize('zeta', ['abs', 1, 0])
def test_constant_discriminator_is_finite(zeta):
    # Dead ReLUs and a nonzero output bias: f != 0 but grad f = 0 (GN-0 divides by zero there).
    D = make_D('mlp', 'relu')
    with torch.no_grad():
        for p in D.parameters():
            p.zero_()
        D.out.bias.fill_(0.3)
    x = torch.randn(4, *SHAPE, dtype=torch.float64, requires_grad=True)
    out = normalize_gradient(D, x, zeta=zeta)
    out.f_hat.sum().backward()
    assert torch.isfinite(out.f_hat).all()
    assert all(torch.isfinite(p.grad).all() for p in D.parameters())
    if zeta == 'abs':
        assert torch.all(out.f_hat == 1)


@pytest.mark.parametrize('dtype,scale', [(torch.float64, 1e-30), (torch.float32, 1e-6)])
def test_gn_is_scale_invariant(dtype, scale):
    # Scaling D's last layer by c scales f and grad f by c, leaving f_hat unchanged: the safety epsilon
    # must not bias f_hat even for very small outputs.
    D = make_D('mlp', 'lrelu').to(dtype)
    x = torch.randn(6, *SHAPE, dtype=dtype)
    reference = normalize_gradient(D, x).f_hat.detach()
    with torch.no_grad():
        D.out.weight.mul_(scale)
        D.out.bias.mul_(scale)
    scaled = normalize_gradient(D, x).f_hat.detach()
    np.testing.assert_allclose(scaled.numpy(), reference.numpy(), rtol=1e-5)


def test_normalize_formula_and_bad_zeta():
    f = torch.tensor([2.0, -3.0, 0.0], dtype=torch.float64)
    n = torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64)
    np.testing.assert_allclose(normalize(f, n, 'abs').numpy(), [2 / 3, -3 / 3.5, 0.0])
    np.testing.assert_allclose(normalize(f, n, 1).numpy(), [1.0, -2.0, 0.0])
    with pytest.raises(ValueError):
        normalize(f, n, 2)


def test_inputs_untouched_and_per_sample():
    D = make_D('cnn', 'lrelu')
    x = torch.randn(5, *SHAPE, dtype=torch.float64)
    out = normalize_gradient(D, x)
    assert not x.requires_grad
    # Each sample's f_hat depends on that sample only.
    single = torch.cat([normalize_gradient(D, x[i:i + 1]).f_hat for i in range(5)])
    np.testing.assert_allclose(out.f_hat.detach().numpy(), single.detach().numpy(), rtol=1e-12)


def test_conditional_label_passes_through():
    D = make_D('mlp', 'relu', c_dim=NUM_CLASSES)
    x = torch.randn(6, *SHAPE, dtype=torch.float64)
    c = torch.eye(NUM_CLASSES, dtype=torch.float64)[torch.tensor([0, 1, 2, 2, 1, 0])]
    out = normalize_gradient(D, x, c)
    f = D(x, c).detach().numpy()[:, 0]
    n = np.linalg.norm(fd_gradient(D, x, c), axis=1)
    np.testing.assert_allclose(out.f_hat.detach().numpy()[:, 0], f / (n + np.abs(f)), rtol=1e-6)

#----------------------------------------------------------------------------
# Fast generator path == exact double backward, for piecewise-linear D.


class TinyG(nn.Module):
    def __init__(self, z_dim=5, c_dim=0):
        super().__init__()
        self.fc1 = nn.Linear(z_dim + c_dim, 16)
        self.fc2 = nn.Linear(16, int(np.prod(SHAPE)))

    def forward(self, z, c=None):
        h = z if c is None else torch.cat([z, c], dim=1)
        return torch.tanh(self.fc2(torch.relu(self.fc1(h)))).reshape(-1, *SHAPE)


LOSS_FNS = {
    'ns': lambda s: torch.nn.functional.softplus(-s).mean(),
    'square': lambda s: (s - 0.3).square().mean(),  # Its weight dL/df_hat varies in sign across samples.
}


@pytest.mark.parametrize('arch,act', CASES)
@pytest.mark.parametrize('zeta', ['abs', 1, 0])
@pytest.mark.parametrize('conditional', [False, True])
def test_fast_generator_path_matches_exact(arch, act, zeta, conditional):
    c_dim = NUM_CLASSES if conditional else 0
    D = make_D(arch, act, c_dim=c_dim)
    torch.manual_seed(3)
    G = TinyG(c_dim=c_dim).double()
    z = torch.randn(7, 5, dtype=torch.float64)
    c = torch.eye(NUM_CLASSES, dtype=torch.float64)[torch.arange(7) % NUM_CLASSES] if conditional else None
    for name, loss_fn in LOSS_FNS.items():
        G_exact, G_fast = copy.deepcopy(G), copy.deepcopy(G)
        out = normalize_gradient(D, G_exact(z, c), c, zeta=zeta)
        loss_exact = loss_fn(out.f_hat)
        loss_exact.backward()
        loss_fast, out_fast = generator_backward_fast(D, G_fast(z, c), c, loss_fn=loss_fn, zeta=zeta)
        np.testing.assert_allclose(loss_fast.item(), loss_exact.item(), rtol=1e-12)
        np.testing.assert_allclose(out_fast.f_hat.numpy(), out.f_hat.detach().numpy(), rtol=1e-12)
        exact = torch.cat([p.grad.flatten() for p in G_exact.parameters()])
        fast = torch.cat([p.grad.flatten() for p in G_fast.parameters()])
        assert exact.norm() > 0
        assert ((fast - exact).norm() / exact.norm()).item() < 1e-5, name


def test_fast_path_requires_generator_output():
    D = make_D('mlp', 'relu')
    with pytest.raises(ValueError):
        generator_backward_fast(D, torch.randn(2, *SHAPE, dtype=torch.float64), loss_fn=lambda s: s.mean())


@pytest.mark.parametrize('arch,act', CASES)
def test_grad_norm_scale_and_gain(arch, act):
    # grad_norm_scale multiplies ||grad_x f|| (norm w.r.t. another input that x is a linear image of);
    # gain multiplies the gradient reaching G (loss scaling) and leaves the loss and the scores unscaled.
    scale, gain = 0.25, 8.0
    D = make_D(arch, act)
    torch.manual_seed(3)
    G = TinyG().double()
    z = torch.randn(7, 5, dtype=torch.float64)
    G_exact, G_fast = copy.deepcopy(G), copy.deepcopy(G)
    x = G_exact(z)
    out = normalize_gradient(D, x, zeta='abs', grad_norm_scale=scale)
    n = np.linalg.norm(fd_gradient(D, x.detach()), axis=1)
    f = D(x).detach().numpy()[:, 0]
    np.testing.assert_allclose(out.grad_norm.detach().numpy()[:, 0], scale * n, rtol=1e-6)
    np.testing.assert_allclose(out.f_hat.detach().numpy()[:, 0], f / (scale * n + np.abs(f)), rtol=1e-6)
    loss_fn = LOSS_FNS['square']
    loss_exact = loss_fn(out.f_hat)
    (loss_exact * gain).backward()
    loss_fast, out_fast = generator_backward_fast(D, G_fast(z), loss_fn=loss_fn, zeta='abs', grad_norm_scale=scale,
                                                  gain=gain)
    np.testing.assert_allclose(loss_fast.item(), loss_exact.item(), rtol=1e-12)
    np.testing.assert_allclose(out_fast.grad_norm.numpy(), out.grad_norm.detach().numpy(), rtol=1e-12)
    exact = torch.cat([p.grad.flatten() for p in G_exact.parameters()])
    fast = torch.cat([p.grad.flatten() for p in G_fast.parameters()])
    assert ((fast - exact).norm() / exact.norm()).item() < 1e-5

#----------------------------------------------------------------------------
# The D step with f in affine form: f = <g, x> + sum_l <dy_l, b_l> for a piecewise-linear D.

D_FAMILIES = [  # (class_name, resolution, kwargs): every discriminator family of the presets.
    ('training.networks.sngan.CNNDiscriminator', 32, dict(ch=8)),
    ('training.networks.sngan.CNNDiscriminator', 48, dict(ch=8)),
    ('training.networks.sngan.ResNetDiscriminator', 32, dict(ch=8)),
    ('training.networks.sngan.ResNetDiscriminator', 48, dict(ch=4)),
    ('training.networks.sngan.ResNetDiscriminator', 128, dict(ch=1)),
    ('training.networks.biggan.BigGANDiscriminator', 32, dict(ch=2)),
]


def preset_D(class_name, resolution, kwargs, c_dim, spectral_norm=False):
    import dnnlib
    torch.manual_seed(0)
    D = dnnlib.util.construct_class_by_name(class_name=class_name, c_dim=c_dim, img_resolution=resolution,
                                            img_channels=3, spectral_norm=spectral_norm, **kwargs).double()
    with torch.no_grad():  # The presets start from zero biases; trained ones are not, and the identity is about them.
        for name, p in D.named_parameters():
            if name.endswith('bias'):
                p.normal_(0, 0.3)
    return D


@pytest.mark.parametrize('class_name,resolution,kwargs', D_FAMILIES)
@pytest.mark.parametrize('c_dim', [0, 4])
@pytest.mark.parametrize('zeta', ['abs', 0])
def test_affine_form_gives_the_double_backward_gradients(class_name, resolution, kwargs, c_dim, zeta):
    """Parameter gradients and input gradients of a loss on f_hat equal the plain double backward's (float64)."""
    from training.step.gradnorm import linearizable_layers
    D = preset_D(class_name, resolution, kwargs, c_dim)
    layers = linearizable_layers(D)
    assert layers is not None and all(m.bias is not None for m in layers)
    x = torch.rand(4, 3, resolution, resolution, dtype=torch.float64) * 2 - 1
    c = torch.eye(4, dtype=torch.float64)[[0, 3, 1, 1]][:, :c_dim]
    results = []
    for bias_layers in (layers, None):
        D.zero_grad(set_to_none=True)
        xr = x.clone().requires_grad_(True)  # As a generator's output would: the loss reaches x too.
        out = normalize_gradient(D, xr, c, zeta=zeta, bias_layers=bias_layers)
        (torch.relu(1 - out.f_hat).mean() + out.f_hat.square().mean()).backward()
        results.append([out.f_hat.detach(), out.grad_norm.detach(), xr.grad] + [p.grad for p in D.parameters()])
    affine, plain = results
    assert all(t is not None for t in affine)
    for a, b in zip(affine, plain):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12 * b.abs().max().item())


def test_linearizable_layers_accepts_only_what_the_identity_covers():
    from training.step.gradnorm import linearizable_layers
    from training.networks.stylegan import Discriminator as StyleGANDiscriminator
    resnet = preset_D(*D_FAMILIES[2], c_dim=4)
    convs_and_linears_with_bias = [m for m in resnet.modules() if isinstance(m, (nn.Conv2d, nn.Linear)) and m.bias is not None]
    assert linearizable_layers(resnet) == convs_and_linears_with_bias and len(convs_and_linears_with_bias) == 11
    assert len(linearizable_layers(preset_D(*D_FAMILIES[2], c_dim=0, spectral_norm=True))) == 11
    assert linearizable_layers(StyleGANDiscriminator(c_dim=0, img_resolution=8, img_channels=3, fmap_base=16, fmap_max=4)) is None

    class FreeOffset(MLP):  # A parameter outside any conv/linear layer: its term would be missing.
        def __init__(self):
            super().__init__(nn.ReLU())
            self.offset = nn.Parameter(torch.ones([]))

    D = FreeOffset()
    D.is_piecewise_linear = D.is_sample_independent = True
    assert linearizable_layers(D) is None
    D.is_sample_independent = False
    assert linearizable_layers(MLP(nn.ReLU())) is None  # Declares nothing.


def test_linearization_error_measures_the_identity():
    from training.step.gradnorm import linearizable_layers, linearization_error
    D = preset_D(*D_FAMILIES[3], c_dim=4)
    x, c = torch.rand(3, 3, 48, 48, dtype=torch.float64), torch.eye(4, dtype=torch.float64)[[1, 2, 3]]
    assert linearization_error(D, linearizable_layers(D), x, c) < 1e-12
    layers = linearizable_layers(D)
    assert linearization_error(D, layers[1:], x, c) > 1e-3  # One bias term left out (the nets' biases are N(0, 0.3^2) here).

    class Shifted(nn.Module):  # Piecewise linear plus a constant no bias layer carries.
        is_piecewise_linear = is_sample_independent = True

        def __init__(self):
            super().__init__()
            self.net = preset_D(*D_FAMILIES[0], c_dim=0)

        def forward(self, x, c):
            return self.net(x, c) + 0.5

    shifted = Shifted()
    assert linearization_error(shifted, linearizable_layers(shifted), torch.rand(2, 3, 32, 32, dtype=torch.float64),
                               torch.zeros(2, 0, dtype=torch.float64)) > 1e-3


class ConvFlops(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the floating-point operations of every convolution, forward or backward (torch's own formulas)."""

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.utils.flop_counter import flop_registry
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func._overloadpacket in (torch.ops.aten.convolution, torch.ops.aten.convolution_backward):
            self.total += flop_registry[func._overloadpacket](*args, **kwargs, out_val=out)
        return out


@pytest.mark.parametrize('class_name,resolution,kwargs', [D_FAMILIES[0], D_FAMILIES[2], D_FAMILIES[5]])
def test_affine_form_runs_four_convolution_passes_instead_of_six(class_name, resolution, kwargs):
    """Convolution work of a GN D step in units of D's forward: the plain double backward runs the forward, the
    first backward (input gradients), and in the second backward two passes through the first backward's graph
    (a convolution of the incoming gradient, a weight gradient) and two through the forward graph (input and
    weight gradients of f's own term): 6. The affine form skips the last two: 4. Each pass costs one forward."""
    from training.step.gradnorm import linearizable_layers
    D = preset_D(class_name, resolution, kwargs, c_dim=0)
    x, c = torch.rand(2, 3, resolution, resolution, dtype=torch.float64), torch.zeros(2, 0, dtype=torch.float64)
    with ConvFlops() as forward, torch.no_grad():
        D(x, c)
    for bias_layers, passes in [(linearizable_layers(D), 4), (None, 6)]:
        with ConvFlops() as step:
            out = normalize_gradient(D, x, c, bias_layers=bias_layers)
            torch.relu(1 - out.f_hat).mean().backward()
        assert step.total / forward.total == pytest.approx(passes, rel=1e-3)
