"""Tests for training/networks/stylegan2.py (NVIDIA's StyleGAN2-ADA networks on the project's ops).

The equality with NVIDIA's own networks runs when GNGAN_NVIDIA_CODE names a checkout of
NVlabs/stylegan2-ada-pytorch or NVlabs/stylegan3 (their code is not part of this project; bench/nvidia.py
imports it from there). The other tests need nothing outside: parameter counts against the layer-by-layer
formula, the modulated convolution and the conditional mapping against float64 re-derivations with plain
torch.nn.functional, GN's double backward against finite differences, snapshots.
"""

import math
import os

import pytest
import torch
import torch.nn.functional as F

from torch_utils import persistence
from training.networks import stylegan2
from training.step import gradnorm

NVIDIA_CODE = os.environ.get('GNGAN_NVIDIA_CODE')

#----------------------------------------------------------------------------
# Equality with NVIDIA's networks.


@pytest.mark.skipif(not NVIDIA_CODE, reason='GNGAN_NVIDIA_CODE does not name a checkout of NVIDIA\'s StyleGAN2 code')
@pytest.mark.parametrize('resolution,c_dim,fp16', [(32, 0, False), (64, 10, False), (32, 10, True)])
def test_equal_to_nvidia(resolution, c_dim, fp16):
    """Given the same weights, every output equals NVIDIA's to 1e-5 of its magnitude. Both compute the same
    operations in the same order, and on a CPU they agree bit for bit but for D's input gradient (a few float32
    ulps: backward accumulation order); 1e-5 leaves room for other BLAS builds and still sees a gain or a term
    out of place (the terms here are O(1) of the output)."""
    from bench import nvidia  # pylint: disable=import-outside-toplevel
    rows = nvidia.compare(nvidia.NvidiaCode(NVIDIA_CODE), resolution, c_dim, fp16, torch.device('cpu'))
    assert {row['output'] for row in rows} == {'G const', 'G none', 'G random', 'G w_avg after 3 calls',
                                               'G eval truncated', 'D', 'D grad'}
    for row in rows:
        assert row['max_abs'] > 0, row
        assert row['max_abs_diff'] <= 1e-5 * row['max_abs'], row

#----------------------------------------------------------------------------
# Parameter counts.


def channels(res, channel_base=32768, channel_max=512):
    return min(channel_base // res, channel_max)


def expected_G_params(res_log2, z_dim=512, w_dim=512, c_dim=0, map_layers=8, img_channels=3, **ch):
    """Layer by layer: dense = in * out + out, modulated conv = affine (w_dim * in + in) + out * in * k^2 +
    bias out (+ noise strength 1), the constant 4x4."""
    dense = lambda i, o: i * o + o
    n = dense(c_dim, w_dim) if c_dim else 0
    n += sum(dense(z_dim + (w_dim if c_dim else 0) if i == 0 else w_dim, w_dim) for i in range(map_layers))
    modconv = lambda i, o, k, noise: dense(w_dim, i) + o * i * k * k + o + noise
    for r in range(2, res_log2 + 1):
        cin, cout = channels(2 ** (r - 1), **ch) if r > 2 else 0, channels(2 ** r, **ch)
        n += cout * 16 if r == 2 else modconv(cin, cout, 3, 1)
        n += modconv(cout, cout, 3, 1) + modconv(cout, img_channels, 1, 0)
    return n


def expected_D_params(res_log2, c_dim=0, img_channels=3, **ch):
    """fromRGB, conv 3x3, conv 3x3 down, 1x1 skip (no bias) per resolution; epilogue conv (with the stddev
    channel), dense, dense to 1 or cmap; conditional: the label's mapping (embed + 8 dense, cmap wide)."""
    conv = lambda i, o, k: o * i * k * k + o
    top = channels(2 ** res_log2, **ch)
    n = conv(img_channels, top, 1)
    for r in range(res_log2, 2, -1):
        tmp, out = channels(2 ** r, **ch), channels(2 ** (r - 1), **ch)
        n += conv(tmp, tmp, 3) + conv(tmp, out, 3) + tmp * out
    c4 = channels(4, **ch)
    cmap = c4 if c_dim else 0
    n += conv(c4 + 1, c4, 3) + (c4 * 16 * c4 + c4) + (c4 * max(cmap, 1) + max(cmap, 1))
    if c_dim:
        n += c_dim * cmap + cmap + 8 * (cmap * cmap + cmap)
    return n


@pytest.mark.parametrize('res_log2,c_dim', [(10, 0), (8, 0), (5, 10)])
def test_parameter_counts(res_log2, c_dim):
    G = stylegan2.Generator(z_dim=512, c_dim=c_dim, w_dim=512, img_resolution=2 ** res_log2, img_channels=3)
    D = stylegan2.Discriminator(c_dim=c_dim, img_resolution=2 ** res_log2, img_channels=3)
    assert sum(p.numel() for p in G.parameters()) == expected_G_params(res_log2, c_dim=c_dim)
    assert sum(p.numel() for p in D.parameters()) == expected_D_params(res_log2, c_dim=c_dim)
    assert G.num_ws == 2 * res_log2 - 2


def test_parameter_counts_small_channels():
    ch = dict(channel_base=512, channel_max=64)
    G = stylegan2.Generator(z_dim=32, c_dim=0, w_dim=32, img_resolution=64, img_channels=1,
                            mapping_kwargs=dict(num_layers=2), synthesis_kwargs=ch)
    D = stylegan2.Discriminator(c_dim=0, img_resolution=64, img_channels=1, **ch)
    assert sum(p.numel() for p in G.parameters()) == expected_G_params(6, z_dim=32, w_dim=32, map_layers=2, img_channels=1, **ch)
    assert sum(p.numel() for p in D.parameters()) == expected_D_params(6, img_channels=1, **ch)

#----------------------------------------------------------------------------
# The arithmetic, in float64 against plain torch.nn.functional.


def lrelu(x):
    return F.leaky_relu(x, 0.2) * math.sqrt(2)


@pytest.mark.parametrize('fused', [True, False])
@pytest.mark.parametrize('noise_mode', ['const', 'none'])
def test_synthesis_layer_modulation_and_demodulation(fused, noise_mode):
    """y = lrelu(conv(x, W * s_n * d_n) + noise * strength + b) * sqrt(2), s = A(w) with A's bias starting at 1,
    d_no = (sum_i,kh,kw (W_oi s_ni)^2 + 1e-8)^(-1/2). Weights scaled down so that the 1e-8 matters."""
    torch.manual_seed(0)
    layer = stylegan2.SynthesisLayer(in_channels=3, out_channels=4, w_dim=5, resolution=6).double()
    with torch.no_grad():
        layer.weight.mul_(1e-4)
        layer.noise_strength.fill_(0.7)
        layer.bias.normal_()
    x, w = torch.randn(2, 3, 6, 6, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64)
    y = layer(x, w, noise_mode=noise_mode, fused_modconv=fused)

    s = w @ (layer.affine.weight / math.sqrt(5)).T + layer.affine.bias  # [N, I]
    expected = []
    for n in range(2):
        W = layer.weight * s[n].view(1, 3, 1, 1)
        W = W / (W.square().sum(dim=[1, 2, 3], keepdim=True) + 1e-8).sqrt()
        expected.append(F.conv2d(x[n:n + 1], W, padding=1))
    expected = torch.cat(expected)
    if noise_mode == 'const':
        expected = expected + layer.noise_const * 0.7
    expected = lrelu(expected + layer.bias.view(1, 4, 1, 1))
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)


def test_torgb_modulation_without_demodulation():
    torch.manual_seed(0)
    layer = stylegan2.ToRGBLayer(in_channels=4, out_channels=3, w_dim=5).double()
    with torch.no_grad():
        layer.bias.normal_()
    x, w = torch.randn(2, 4, 3, 3, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64)
    s = (w @ (layer.affine.weight / math.sqrt(5)).T + layer.affine.bias) / math.sqrt(4)
    expected = torch.einsum('oi,ni,nihw->nohw', layer.weight[:, :, 0, 0], s, x) + layer.bias.view(1, 3, 1, 1)
    for fused in (True, False):
        torch.testing.assert_close(layer(x, w, fused_modconv=fused), expected, rtol=1e-12, atol=1e-12)


def test_conditional_mapping_and_truncation():
    """w = fc_L(...fc_0([n(z), n(E c)])) with n(v) = v / sqrt(mean(v^2) + 1e-8), dense layers with lr multiplier
    0.01 (weights scaled by 0.01 / sqrt(fan_in), biases by 0.01); truncation lerps the first `cutoff` copies
    towards w_avg."""
    torch.manual_seed(0)
    mapping = stylegan2.MappingNetwork(z_dim=6, c_dim=3, w_dim=5, num_ws=4, num_layers=2, embed_features=7).double()
    with torch.no_grad():
        for p in mapping.parameters():
            p.normal_()
        mapping.w_avg.normal_()
    z, c = torch.randn(2, 6, dtype=torch.float64), torch.eye(3, dtype=torch.float64)[[2, 0]]
    norm = lambda v: v / (v.square().mean(dim=1, keepdim=True) + 1e-8).sqrt()
    e = c @ (mapping.embed.weight / math.sqrt(3)).T + mapping.embed.bias
    x = torch.cat([norm(z), norm(e)], dim=1)
    for i, fan_in in enumerate([13, 5]):
        fc = getattr(mapping, f'fc{i}')
        x = lrelu(x @ (fc.weight * 0.01 / math.sqrt(fan_in)).T + fc.bias * 0.01)
    mapping.eval()
    torch.testing.assert_close(mapping(z, c), x.unsqueeze(1).repeat(1, 4, 1), rtol=1e-12, atol=1e-12)
    ws = mapping(z, c, truncation_psi=0.7, truncation_cutoff=3)
    torch.testing.assert_close(ws[:, :3], (mapping.w_avg + 0.7 * (x - mapping.w_avg)).unsqueeze(1).repeat(1, 3, 1))
    torch.testing.assert_close(ws[:, 3], x)


def test_w_avg_tracks_the_batch_mean_in_training_mode():
    torch.manual_seed(0)
    G = stylegan2.Generator(z_dim=8, c_dim=0, w_dim=8, img_resolution=8, img_channels=3,
                            mapping_kwargs=dict(num_layers=1), synthesis_kwargs=dict(channel_base=64, channel_max=8))
    z = torch.randn(4, 8)
    w = G.mapping.eval()(z, None)[:, 0]
    G.train()(z, torch.zeros(4, 0), noise_mode='none')
    torch.testing.assert_close(G.mapping.w_avg, w.mean(dim=0) * (1 - 0.995))
    G.mapping(z, None, skip_w_avg_update=True)
    torch.testing.assert_close(G.mapping.w_avg, w.mean(dim=0) * (1 - 0.995))


def test_truncation_to_the_average_gives_one_image():
    torch.manual_seed(0)
    G = stylegan2.Generator(z_dim=8, c_dim=0, w_dim=8, img_resolution=16, img_channels=3,
                            synthesis_kwargs=dict(channel_base=64, channel_max=8)).eval()
    img = G(torch.randn(3, 8), None, truncation_psi=0, noise_mode='const')
    torch.testing.assert_close(img[1:], img[:1].expand(2, -1, -1, -1))
    assert not torch.allclose(G(torch.randn(3, 8), None, noise_mode='const')[0], img[0])

#----------------------------------------------------------------------------
# Training-side properties.


def test_gn_double_backward_through_D_matches_finite_differences():
    """d/dtheta of sum(f / (||grad_x f|| + |f|)) through D (minibatch stddev, resnet blocks, conditional)."""
    torch.manual_seed(0)
    D = stylegan2.Discriminator(c_dim=3, img_resolution=8, img_channels=3, channel_base=64, channel_max=8,
                                mapping_kwargs=dict(num_layers=1), epilogue_kwargs=dict(mbstd_group_size=2)).double()
    x = torch.randn(4, 3, 8, 8, dtype=torch.float64)
    c = torch.eye(3, dtype=torch.float64)[[0, 1, 2, 0]]
    objective = lambda: gradnorm.normalize_gradient(D, x, c).f_hat.sum()
    params = [D.b8.conv0.weight, D.b4.fc.weight, D.mapping.embed.weight]
    grads = torch.autograd.grad(objective(), params)
    h = 1e-6
    for p, g in zip(params, grads):
        for index in [(0,) * p.ndim, tuple(s - 1 for s in p.shape)]:
            values = []
            for step in (h, -2 * h, h):
                with torch.no_grad():
                    p[index] += step
                values.append(objective().detach())
            up, down = values[:2]
            assert float(g[index]) == pytest.approx(float((up - down) / (2 * h)), rel=1e-5, abs=1e-9)


def test_fp16_blocks_compute_in_float32_off_cuda():
    """On a CPU the top float16 resolutions fall back to float32: the same outputs as without them."""
    kwargs = dict(c_dim=0, img_resolution=16, img_channels=3, channel_base=64, channel_max=8)
    torch.manual_seed(0)
    D16 = stylegan2.Discriminator(num_fp16_res=2, conv_clamp=256, **kwargs)
    D32 = stylegan2.Discriminator(**kwargs)
    D32.load_state_dict(D16.state_dict())
    x = torch.randn(4, 3, 16, 16)
    out = D16(x, None)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, D32(x, None), rtol=0, atol=0)


def test_architectures_and_snapshot_round_trip(tmp_path):
    torch.manual_seed(0)
    G = stylegan2.Generator(z_dim=8, c_dim=2, w_dim=8, img_resolution=16, img_channels=3,
                            mapping_kwargs=dict(num_layers=2),
                            synthesis_kwargs=dict(channel_base=64, channel_max=8, architecture='resnet'))
    D = stylegan2.Discriminator(c_dim=2, img_resolution=16, img_channels=3, architecture='skip', channel_base=64,
                                channel_max=8, block_kwargs=dict(freeze_layers=2))
    assert isinstance(G.synthesis.b8.skip, stylegan2.Conv2dLayer) and not hasattr(G.synthesis.b8, 'torgb')
    assert 'b16.fromrgb.weight' in dict(D.named_buffers())  # Frozen layers keep their names, as buffers.
    path = str(tmp_path / 'snapshot.pkl')
    persistence.save_snapshot(path, dict(G=G, D=D))
    data = persistence.load_snapshot(path)
    z, c = torch.randn(2, 8), torch.eye(2)
    torch.testing.assert_close(data['G'](z, c, noise_mode='const'), G.eval()(z, c, noise_mode='const'), rtol=0, atol=0)
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(data['D'](x, c), D(x, c), rtol=0, atol=0)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match='power of two'):
        stylegan2.Discriminator(c_dim=0, img_resolution=48, img_channels=3)
    with pytest.raises(ValueError, match='architecture'):
        stylegan2.Discriminator(c_dim=0, img_resolution=8, img_channels=3, architecture='dense')
    G = stylegan2.Generator(z_dim=4, c_dim=0, w_dim=4, img_resolution=8, img_channels=3,
                            synthesis_kwargs=dict(channel_base=32, channel_max=4))
    with pytest.raises(ValueError, match='noise_mode'):
        G(torch.randn(1, 4), None, noise_mode='fixed')


@pytest.mark.gpu
def test_fp16_blocks_on_cuda_follow_float64():
    """On CUDA the float16 blocks (clamped at 256) stay within float16 rounding of the float64 network."""
    torch.manual_seed(0)
    kwargs = dict(z_dim=32, c_dim=0, w_dim=32, img_resolution=64, img_channels=3)
    G = stylegan2.Generator(**kwargs, synthesis_kwargs=dict(channel_base=1024, channel_max=64, num_fp16_res=2,
                                                            conv_clamp=256)).cuda().eval()
    D = stylegan2.Discriminator(c_dim=0, img_resolution=64, img_channels=3, channel_base=1024, channel_max=64,
                                num_fp16_res=2, conv_clamp=256).cuda()
    z = torch.randn(8, 32, device='cuda')
    img = G(z, None, noise_mode='const')
    img64 = G.double()(z.double(), None, noise_mode='const')
    assert G.synthesis.b64.use_fp16 and img.dtype == torch.float32
    err = (img.double() - img64).abs().max() / img64.abs().max()
    assert 1e-6 < err < 2e-2  # float16 really used (not float32), and its rounding only
    x = img64.float()
    out, out64 = D(x, None), D.double()(x.double(), None)
    assert ((out.double() - out64).abs().max() / out64.abs().max()) < 2e-2


def test_spectral_norm_discriminator_and_its_snapshot(tmp_path):
    """--norm=sn: every trained weight is divided by its largest singular value (torch's power iteration converging
    over training-mode calls) in place of the equalized-lr scale; the snapshot rebuilds it."""
    torch.manual_seed(0)
    D = stylegan2.SNDiscriminator(c_dim=3, img_resolution=8, img_channels=3, channel_base=64, channel_max=8,
                                  mapping_kwargs=dict(num_layers=1))
    x, c = torch.randn(4, 3, 8, 8), torch.eye(3)[[0, 1, 2, 0]]
    for _ in range(30):
        D(x, c)
    layers = [m for m in D.modules() if isinstance(m, (stylegan2.Conv2dLayer, stylegan2.FullyConnectedLayer))]
    assert len(layers) == 9 and all(m.weight_gain == 1.0 for m in layers)  # b8: 4, b4: 3, label mapping: 2.
    for layer in layers:
        assert torch.linalg.matrix_norm(layer.weight.flatten(1), ord=2).item() == pytest.approx(1, rel=1e-3)
    path = str(tmp_path / 'snapshot.pkl')
    persistence.save_snapshot(path, dict(D=D))
    D.eval()
    torch.testing.assert_close(persistence.load_snapshot(path)['D'](x, c), D(x, c), rtol=0, atol=0)
