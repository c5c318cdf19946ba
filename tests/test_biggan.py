"""BigGAN at 32x32: parameter counts of the paper's model, conditioning, SN in G, sum pooling, snapshots."""

import numpy as np
import torch

from torch_utils import persistence
from training.networks.biggan import BigGANDiscriminator, BigGANGenerator


def count(module):
    return sum(p.numel() for p in module.parameters())


def test_parameter_counts_match_paper():
    with torch.device('meta'):
        G = BigGANGenerator(c_dim=10, img_resolution=32, img_channels=3)
        D = BigGANDiscriminator(c_dim=10, img_resolution=32, img_channels=3)
    assert count(G) == 4_304_387
    assert count(D) == 4_207_361


def test_generator_is_spectrally_normalized_and_discriminator_only_on_request():
    G = BigGANGenerator(c_dim=10, img_resolution=32, img_channels=3, ch=8)
    is_sn = torch.nn.utils.parametrize.is_parametrized
    layers = [m for m in G.modules() if isinstance(m, torch.nn.Conv2d)] + [G.fc]
    assert all(is_sn(m, 'weight') for m in layers)
    class_gains = [m for block in G.blocks for norm in (block.norm1, block.norm2) for m in (norm.gain, norm.bias)]
    assert len(class_gains) == 12 and not any(is_sn(m) for m in class_gains)  # BigGAN's class embeddings carry no SN.
    D = BigGANDiscriminator(c_dim=10, img_resolution=32, img_channels=3, ch=8)
    assert not any(is_sn(m) for m in D.modules())
    D_sn = BigGANDiscriminator(c_dim=10, img_resolution=32, img_channels=3, ch=8, spectral_norm=True)
    assert all(is_sn(m, 'weight') for m in D_sn.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)))


def test_shapes_range_and_label_dependence():
    torch.manual_seed(0)
    G = BigGANGenerator(c_dim=10, img_resolution=32, img_channels=3, ch=8)
    D = BigGANDiscriminator(c_dim=10, img_resolution=32, img_channels=3, ch=8)
    assert D.is_piecewise_linear
    z = torch.randn(2, 128).repeat(2, 1)
    c = torch.eye(10)[torch.tensor([3, 3, 7, 7])]
    img = G(z, c)
    assert img.shape == (4, 3, 32, 32) and img.min() >= -1 and img.max() <= 1
    assert not torch.allclose(img[:2], img[2:])
    f = D(img.detach(), c)
    assert f.shape == (4, 1)
    g = D(img.detach()[:2].repeat(2, 1, 1, 1), c)
    assert not torch.allclose(g[:2], g[2:])


def test_discriminator_uses_sum_pooling_and_projection():
    torch.manual_seed(0)
    D = BigGANDiscriminator(c_dim=10, img_resolution=32, img_channels=3, ch=8)
    x, c = torch.randn(3, 3, 32, 32), torch.eye(10)[[1, 4, 9]]
    features = {}
    D.blocks[-1].register_forward_hook(lambda m, i, o: features.setdefault('last', o))
    f = D(x, c).detach().numpy()
    h = np.maximum(features['last'].detach().numpy(), 0).sum(axis=(2, 3))
    w, b = D.fc.weight.detach().numpy(), D.fc.bias.detach().numpy()
    embed = D.projection.embed.weight.detach().numpy().T  # [c_dim, ch]
    expected = h @ w.T + b + np.sum((c.numpy() @ embed) * h, axis=1, keepdims=True)
    np.testing.assert_allclose(f, expected, rtol=1e-5)


def test_unconditional_variant():
    # Without labels BigGAN at 32x32 is SN-GAN's 32x32 ResNet: G loses the class-conditional BN gains and biases of
    # its 6 block BNs (2 x 10 x 256 each) for plain affine ones (2 x 256) and so has the released SN-GAN ResNet-32
    # count; D loses the 10 x 256 projection embedding, and its output is the linear read-out of sum-pooled features.
    with torch.device('meta'):
        G = BigGANGenerator(c_dim=0, img_resolution=32, img_channels=3)
        D = BigGANDiscriminator(c_dim=0, img_resolution=32, img_channels=3)
    assert count(G) == 4_304_387 - 6 * 2 * 10 * 256 + 6 * 2 * 256 == 4_276_739
    assert count(D) == 4_207_361 - 10 * 256
    torch.manual_seed(0)
    D = BigGANDiscriminator(c_dim=0, img_resolution=32, img_channels=3, ch=8)
    with torch.no_grad():
        D.fc.bias.fill_(0.3)
    x = torch.randn(2, 3, 32, 32)
    features = {}
    D.blocks[-1].register_forward_hook(lambda m, i, o: features.setdefault('last', o))
    f = D(x, torch.zeros(2, 0)).detach().numpy()
    h = np.maximum(features['last'].detach().numpy(), 0).sum(axis=(2, 3))
    np.testing.assert_allclose(f, h @ D.fc.weight.detach().numpy().T + 0.3, rtol=1e-5)


def test_snapshot_round_trip(tmp_path):
    torch.manual_seed(0)
    G = BigGANGenerator(c_dim=10, img_resolution=32, img_channels=3, ch=8)
    G(torch.randn(4, 128), torch.eye(10)[:4])  # Advance G's power iteration and BN statistics.
    persistence.save_snapshot(str(tmp_path / 'g.pkl'), {'G': G})
    G2 = persistence.load_snapshot(str(tmp_path / 'g.pkl')).G
    G.eval()
    z, c = torch.randn(3, 128), torch.eye(10)[[0, 5, 9]]
    assert torch.equal(G2(z, c), G(z, c))
