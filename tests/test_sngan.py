"""SN-GAN standard CNN and ResNet: parameter counts of the paper's models, shapes, init, pooling, SN, snapshots."""

import numpy as np
import pytest
import torch

from torch_utils import persistence
from training.networks.sngan import (CNNDiscriminator, CNNGenerator, ResNetDiscriminator, ResNetGenerator,
                                     apply_spectral_norm)

# Parameter counts of the GN-GAN authors' released models (basiclab/GNGAN-PyTorch, models/dcgan.py and
# models/resnet.py; 3 channels, unconditional). Their SN variants hold the same learnable weights: spectral
# normalization adds only the power-iteration vectors, which are buffers, not parameters.
PARAM_COUNTS = [
    (CNNGenerator, 32, 3_813_379), (CNNDiscriminator, 32, 5_860_865),
    (CNNGenerator, 48, 5_134_339), (CNNDiscriminator, 48, 5_871_105),
    (ResNetGenerator, 32, 4_276_739), (ResNetDiscriminator, 32, 1_053_825),
    (ResNetGenerator, 48, 4_878_083), (ResNetDiscriminator, 48, 4_859_073),
    (ResNetGenerator, 128, 32_150_787), (ResNetDiscriminator, 128, 38_419_137),
    (ResNetGenerator, 256, 37_135_107), (ResNetDiscriminator, 256, 43_401_409),
]


@pytest.mark.parametrize('cls,resolution,count', PARAM_COUNTS)
def test_parameter_counts_match_paper(cls, resolution, count):
    with torch.device('meta'):
        net = cls(c_dim=0, img_resolution=resolution, img_channels=3)
    assert sum(p.numel() for p in net.parameters()) == count
    if cls in (CNNDiscriminator, ResNetDiscriminator):
        with torch.device('meta'):
            net = cls(c_dim=0, img_resolution=resolution, img_channels=3, spectral_norm=True)
        assert sum(p.numel() for p in net.parameters()) == count


def _batch_norm(x, weight, bias, eps=1e-5):
    """Training-mode batch norm by its definition: per channel over (N, H, W), biased variance."""
    mean = x.mean(dim=(0, 2, 3), keepdim=True)
    var = ((x - mean) ** 2).mean(dim=(0, 2, 3), keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight[None, :, None, None] + bias[None, :, None, None]


def _deconv(x, weight, bias, stride, padding):
    """Transposed convolution by its definition: insert stride-1 zeros between pixels, pad by k-1-padding,
    then correlate with the kernel flipped in space and with in/out channels swapped."""
    n, c, h, w = x.shape
    k = weight.shape[-1]
    up = x.new_zeros(n, c, (h - 1) * stride + 1, (w - 1) * stride + 1)
    up[:, :, ::stride, ::stride] = x
    return torch.nn.functional.conv2d(up, weight.transpose(0, 1).flip(2, 3), bias, padding=k - 1 - padding)


def test_cnn_generator_is_sngan_standard_cnn():
    # SN-GAN (Miyato et al. 2018), Table 3(a): z -> dense M x M x 8ch -> BN, ReLU -> [4x4 stride-2 deconv, BN, ReLU] x 3
    # halving the width -> 3x3 stride-1 (de)conv to the image channels -> tanh; M = resolution / 8. Recomputed in
    # float64 from the definitions of batch norm and transposed convolution.
    torch.manual_seed(0)
    G = CNNGenerator(c_dim=0, img_resolution=48, img_channels=3, z_dim=16, ch=4).double()
    with torch.no_grad():
        for norm in G.norms:  # Non-trivial affine parameters, so that their placement matters.
            norm.bn.weight.uniform_(0.5, 1.5)
            norm.bn.bias.uniform_(-0.5, 0.5)
        for conv in list(G.convs) + [G.to_rgb]:
            conv.bias.uniform_(-0.1, 0.1)
    z = torch.randn(5, 16, dtype=torch.float64)
    x = (z @ G.fc.weight.T + G.fc.bias).view(5, 32, 6, 6)
    for norm, conv in zip(G.norms[:-1], G.convs):
        x = _deconv(torch.relu(_batch_norm(x, norm.bn.weight, norm.bn.bias)), conv.weight, conv.bias, stride=2, padding=1)
    x = _deconv(torch.relu(_batch_norm(x, G.norms[-1].bn.weight, G.norms[-1].bn.bias)), G.to_rgb.weight, G.to_rgb.bias,
                stride=1, padding=1)
    expected = torch.tanh(x)
    assert expected.shape == (5, 3, 48, 48)
    torch.testing.assert_close(G(z, torch.zeros(5, 0, dtype=torch.float64)), expected, rtol=1e-10, atol=1e-10)


def test_cnn_discriminator_is_released_standard_cnn():
    # The authors' release (models/dcgan.py): 3x3 conv to ch, then [4x4 stride-2 conv doubling the width, 3x3 conv]
    # x 3, each conv followed by LeakyReLU(0.1); the flattened (res/8)^2 x 8ch features feed one linear unit.
    torch.manual_seed(0)
    D = CNNDiscriminator(c_dim=0, img_resolution=48, img_channels=3, ch=4).double()
    with torch.no_grad():
        for layer in list(D.convs) + [D.fc]:
            layer.bias.uniform_(-0.1, 0.1)
    spec = [(3, 1, 1)] + [(4, 2, 1), (3, 1, 1)] * 3  # (kernel, stride, padding)
    img = torch.rand(3, 3, 48, 48, dtype=torch.float64) * 2 - 1
    x = img
    for conv, (k, stride, padding) in zip(D.convs, spec):
        assert conv.weight.shape[-1] == k
        x = torch.nn.functional.conv2d(x, conv.weight, conv.bias, stride=stride, padding=padding)
        x = torch.where(x > 0, x, 0.1 * x)
    assert x.shape == (3, 32, 6, 6)
    expected = x.flatten(1) @ D.fc.weight.T + D.fc.bias
    torch.testing.assert_close(D(img, torch.zeros(3, 0, dtype=torch.float64)), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('D_class,resolution', [(CNNDiscriminator, 48), (ResNetDiscriminator, 32), (ResNetDiscriminator, 48)])
@pytest.mark.parametrize('c_dim', [0, 5])
def test_discriminators_are_piecewise_linear(D_class, resolution, c_dim):
    # GN's fast generator step relies on `is_piecewise_linear`: then the Hessian of D w.r.t. its input vanishes
    # (almost everywhere), so a Hessian-vector product is zero, and with zero biases (the init) D is positively
    # homogeneous: D(a x) = a D(x) for a > 0.
    torch.manual_seed(0)
    D = D_class(c_dim=c_dim, img_resolution=resolution, img_channels=3, ch=4).double()
    assert D.is_piecewise_linear
    x = torch.randn(3, 3, resolution, resolution, dtype=torch.float64, requires_grad=True)
    c = torch.eye(c_dim, dtype=torch.float64)[[0, 1, 2]] if c_dim else torch.zeros(3, 0, dtype=torch.float64)
    f = D(x, c)
    grad, = torch.autograd.grad(f.sum(), x, create_graph=True)
    hvp, = torch.autograd.grad((grad * torch.randn_like(x)).sum(), x, allow_unused=True)
    assert hvp is None or hvp.abs().max() <= 1e-12 * grad.abs().max()
    torch.testing.assert_close(D(2.5 * x, c), 2.5 * f, rtol=1e-10, atol=0)


def test_conditional_parameters():
    # Class-conditional BN replaces each block BN's 2C affine parameters by 2 * c_dim * C; projection adds c_dim * C.
    with torch.device('meta'):
        G0 = ResNetGenerator(c_dim=0, img_resolution=32, img_channels=3)
        G10 = ResNetGenerator(c_dim=10, img_resolution=32, img_channels=3)
        D0 = ResNetDiscriminator(c_dim=0, img_resolution=32, img_channels=3)
        D10 = ResNetDiscriminator(c_dim=10, img_resolution=32, img_channels=3)
    count = lambda m: sum(p.numel() for p in m.parameters())
    assert count(G10) - count(G0) == 6 * (2 * 10 * 256 - 2 * 256)  # Three blocks, two BNs each, 256 channels.
    assert count(D10) - count(D0) == 10 * 128


def test_conditional_outputs_depend_on_label():
    torch.manual_seed(0)
    G = ResNetGenerator(c_dim=3, img_resolution=32, img_channels=3, ch=4)
    D = ResNetDiscriminator(c_dim=3, img_resolution=32, img_channels=3, ch=4)
    with torch.no_grad():
        for m in G.modules():
            if hasattr(m, 'gain') and isinstance(m.gain, torch.nn.Linear):
                m.gain.weight.normal_()
    z = torch.randn(2, 128).repeat(2, 1)
    c = torch.eye(3)[torch.tensor([0, 0, 1, 1])]
    img = G(z, c)
    assert not torch.allclose(img[:2], img[2:])
    x = torch.randn(2, 3, 32, 32).repeat(2, 1, 1, 1)
    f = D(x, c)
    assert not torch.allclose(f[:2], f[2:])


def test_resnet_init_is_kaiming_normal_with_zero_bias():
    torch.manual_seed(0)
    D = ResNetDiscriminator(c_dim=0, img_resolution=32, img_channels=3)
    conv = D.blocks[1].conv1  # 128 -> 128, 3x3: fan_in 1152.
    assert abs(conv.weight.std().item() / np.sqrt(2 / 1152) - 1) < 0.01  # 147k samples: 5 standard errors.
    assert abs(conv.weight.mean().item()) < 1e-3
    assert all(torch.all(m.bias == 0) for m in D.modules() if isinstance(m, torch.nn.Conv2d))


def test_resnet_discriminator_ends_in_global_average_pooling():
    torch.manual_seed(0)
    D = ResNetDiscriminator(c_dim=0, img_resolution=32, img_channels=3, ch=4)
    x = torch.randn(2, 3, 32, 32)
    features = {}
    D.blocks[-1].register_forward_hook(lambda m, i, o: features.setdefault('last', o))
    D.fc.register_forward_hook(lambda m, i, o: features.setdefault('fc_in', i[0]))
    D(x, torch.zeros(2, 0))
    last = features['last'].detach().numpy()
    np.testing.assert_allclose(features['fc_in'].detach().numpy(), np.maximum(last, 0).mean(axis=(2, 3)), rtol=1e-6)
    assert last.shape[-1] == 8  # 32 -> 16 -> 8, then two blocks at 8x8.


def test_spectral_norm_normalizes_weights():
    torch.manual_seed(0)
    D = CNNDiscriminator(c_dim=0, img_resolution=16, img_channels=3, ch=4, spectral_norm=True)
    x = torch.randn(2, 3, 16, 16)
    for _ in range(10):  # The power iteration advances once per training-mode forward.
        D(x, torch.zeros(2, 0))
    for layer in list(D.convs) + [D.fc]:
        sigma = np.linalg.svd(layer.weight.detach().reshape(layer.weight.shape[0], -1).numpy(), compute_uv=False)[0]
        assert 1 - 1e-5 < sigma < 1.01  # Power iteration approaches sigma(W) from below.


def test_snapshot_round_trip(tmp_path):
    torch.manual_seed(0)
    D = ResNetDiscriminator(c_dim=4, img_resolution=32, img_channels=3, ch=4, spectral_norm=True)
    G = ResNetGenerator(c_dim=4, img_resolution=32, img_channels=3, ch=4)
    D(torch.randn(2, 3, 32, 32), torch.eye(4)[:2])  # Advance SN's power iteration past its initial state.
    persistence.save_snapshot(str(tmp_path / 'snap.pkl'), {'D': D, 'G': G})
    data = persistence.load_snapshot(str(tmp_path / 'snap.pkl'))
    x, z, c = torch.randn(3, 3, 32, 32), torch.randn(3, 128), torch.eye(4)[:3]
    D.eval(), G.eval()
    assert torch.equal(data.D(x, c), D(x, c))
    assert torch.equal(data.G(z, c), G(z, c))


def test_bad_resolution_raises():
    with pytest.raises(ValueError, match='128'):
        ResNetGenerator(c_dim=0, img_resolution=64, img_channels=3)
    with pytest.raises(ValueError):
        CNNDiscriminator(c_dim=0, img_resolution=30, img_channels=3)


def test_apply_spectral_norm_only_on_weights():
    layer = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    apply_spectral_norm(layer)
    assert torch.nn.utils.parametrize.is_parametrized(layer[0], 'weight')
    assert torch.nn.utils.parametrize.is_parametrized(layer[2], 'weight')
    assert not torch.nn.utils.parametrize.is_parametrized(layer[0], 'bias')


def test_discriminator_conv_has_the_double_backward_of_torch_conv():
    """The D convolutions run through ops/conv2d_gradfix (its Function inside higher_order_gradients(), as in GN's
    steps); GN differentiates them twice, so compare both orders."""
    from ops import conv2d_gradfix
    from training.networks.sngan import Conv2d
    torch.manual_seed(0)
    ours = Conv2d(3, 4, 4, stride=2, padding=1).double()
    ref = torch.nn.Conv2d(3, 4, 4, stride=2, padding=1).double()
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    results = []
    for conv in (ours, ref):
        xi = x.clone().requires_grad_(True)
        with conv2d_gradfix.higher_order_gradients(conv is ours):
            h = conv(xi)
        assert (h.grad_fn.name() == '_Conv2dBackward') == (conv is ours)
        y = torch.relu(h).square().sum()
        g, = torch.autograd.grad(y, xi, create_graph=True)
        g.norm().backward()  # The GN shape: a loss on ||grad_x f||.
        results.append([g.detach(), xi.grad, conv.weight.grad, conv.bias.grad])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
