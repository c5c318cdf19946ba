"""Tests for training/networks/stylegan.py (StyleGAN v1 with progressive growing).

Reference values come from the official release's parameter counts, from plain torch.nn.functional
re-derivations of each layer in float64, from numpy, and from the fade-in formulas worked by hand.
Networks other than the full-size ones are built tiny so that everything runs on a CPU in seconds.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torch_utils import persistence, training_stats
from training.networks import stylegan
from training.step import loss as loss_lib

#----------------------------------------------------------------------------
# Helpers.

TINY = dict(fmap_base=64, fmap_max=16)  # Channels 16, 16, 8, 4 at 4, 8, 16, 32.


def tiny_G(img_resolution=32, c_dim=0, **kwargs):
    torch.manual_seed(0)
    return stylegan.Generator(c_dim=c_dim, img_resolution=img_resolution, img_channels=3, z_dim=16, w_dim=16,
                              mapping_kwargs=dict(layer_features=16), **TINY, **kwargs)


def tiny_D(img_resolution=32, c_dim=0, **kwargs):
    torch.manual_seed(1)
    return stylegan.Discriminator(c_dim=c_dim, img_resolution=img_resolution, img_channels=3, **TINY, **kwargs)


def num_params(module):
    return sum(p.numel() for p in module.parameters())


def nearest_up(x, factor=2):
    return x.repeat_interleave(factor, dim=2).repeat_interleave(factor, dim=3)


def blur_ref(x):
    """[1,2,1] x [1,2,1] / 16 depthwise blur with zero padding, in plain torch."""
    k = torch.tensor([1.0, 2.0, 1.0], dtype=x.dtype)
    k = torch.outer(k, k) / 16
    n, c, h, w = x.shape
    return F.conv2d(F.pad(x.reshape(n * c, 1, h, w), [1, 1, 1, 1]), k[None, None]).reshape(n, c, h, w)

#----------------------------------------------------------------------------
# Architecture.


@pytest.mark.parametrize('resolution, G_total, D_total', [(1024, 26_219_627, 23_087_249), (256, 26_086_229, 23_052_353)])
def test_parameter_counts_match_official_release(resolution, G_total, D_total):
    G = stylegan.Generator(c_dim=0, img_resolution=resolution, img_channels=3)
    assert num_params(G.mapping) == 2_101_248
    assert num_params(G) == G_total
    if resolution == 1024:
        assert num_params(G.synthesis) == 24_118_379
    assert G.num_ws == 2 * int(math.log2(resolution)) - 2
    del G
    assert num_params(stylegan.Discriminator(c_dim=0, img_resolution=resolution, img_channels=3)) == D_total


def test_conditional_parameter_counts():
    # Label embedding [c_dim, z_dim] concatenated with z doubles the first dense layer's inputs;
    # D's last dense layer has one output per class.
    G0, G3 = tiny_G(c_dim=0), tiny_G(c_dim=3)
    assert num_params(G3) - num_params(G0) == 3 * 16 + 16 * 16
    D0, D3 = tiny_D(c_dim=0), tiny_D(c_dim=3)
    assert num_params(D3) - num_params(D0) == 2 * (16 + 1)


def test_dense_layer_equalized_lr():
    torch.manual_seed(0)
    layer = stylegan.FullyConnectedLayer(in_features=6, out_features=5, activation='lrelu', gain=math.sqrt(2),
                                         lr_multiplier=0.01).double()
    assert 50 < layer.weight.std().item() < 200  # Stored as N(0, 1 / 0.01^2).
    with torch.no_grad():
        layer.bias.normal_()
    x = torch.randn(4, 6, dtype=torch.float64)
    expected = F.leaky_relu(x @ layer.weight.T * (math.sqrt(2) / math.sqrt(6) * 0.01) + layer.bias * 0.01, 0.2)
    torch.testing.assert_close(layer(x), expected, rtol=1e-12, atol=1e-12)


def test_conv_layers_match_release_composition():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    up = stylegan.Conv2dLayer(in_channels=3, out_channels=5, kernel_size=3, bias=False, up=2).double()
    w = up.weight * math.sqrt(2) / math.sqrt(3 * 9)
    expected = blur_ref(F.conv2d(nearest_up(x), w, padding=1))  # Nearest upsample, conv, blur.
    torch.testing.assert_close(up(x), expected, rtol=1e-12, atol=1e-12)

    down = stylegan.Conv2dLayer(in_channels=3, out_channels=5, kernel_size=3, down=2, activation='lrelu').double()
    with torch.no_grad():
        down.bias.normal_()
    w = down.weight * math.sqrt(2) / math.sqrt(3 * 9)
    expected = F.leaky_relu(F.avg_pool2d(F.conv2d(blur_ref(x), w, padding=1), 2) + down.bias[:, None, None], 0.2)
    torch.testing.assert_close(down(x), expected, rtol=1e-12, atol=1e-12)


def test_layer_epilogue_formula():
    torch.manual_seed(0)
    epi = stylegan.LayerEpilogue(channels=4, w_dim=6, resolution=8).double()
    with torch.no_grad():
        for p in epi.parameters():
            p.normal_()
    x, w = torch.randn(2, 4, 8, 8, dtype=torch.float64), torch.randn(2, 6, dtype=torch.float64)
    y = x + epi.noise_const * epi.noise_strength[:, None, None]
    y = F.leaky_relu(y + epi.bias[:, None, None], 0.2)
    y = (y - y.mean(dim=[2, 3], keepdim=True)) / torch.sqrt(y.var(dim=[2, 3], unbiased=False, keepdim=True) + 1e-8)
    style = w @ epi.affine.weight.T / math.sqrt(6) + epi.affine.bias
    expected = y * (1 + style[:, :4, None, None]) + style[:, 4:, None, None]
    torch.testing.assert_close(epi(x, w, noise_mode='const'), expected, rtol=1e-10, atol=1e-10)


def test_minibatch_stddev_against_numpy():
    x = np.random.default_rng(0).standard_normal([8, 6, 3, 3])
    out = stylegan.MinibatchStdLayer(group_size=4, num_channels=2)(torch.tensor(x)).numpy()
    expected = np.empty([8, 2])
    for i in range(8):
        members = x[i % 2::2]  # Group of sample i: i, i +- 2, ... (4 groups members, stride N / 4).
        std = np.sqrt(members.var(axis=0) + 1e-8)  # [6, 3, 3]
        expected[i] = [std[:3].mean(), std[3:].mean()]
    np.testing.assert_allclose(out[:, :6], x)
    np.testing.assert_allclose(out[:, 6:], np.broadcast_to(expected[:, :, None, None], [8, 2, 3, 3]), rtol=1e-10)
    with pytest.raises(ValueError):
        stylegan.MinibatchStdLayer(group_size=4)(torch.zeros(6, 4, 2, 2))

#----------------------------------------------------------------------------
# Progressive growing.


def test_output_shapes_at_every_lod():
    G, D = tiny_G().eval(), tiny_D()
    z, c = torch.randn(4, 16), torch.zeros(4, 0)
    for lod in [0, 0.25, 0.5, 1, 1.5, 2, 2.75, 3]:
        G.set_lod(lod)
        D.set_lod(lod)
        size = 32 >> math.floor(lod)
        img = G(z, c)
        assert img.shape == (4, 3, size, size)
        assert D(img, c).shape == (4, 1)
    with pytest.raises(AssertionError):
        D(torch.zeros(4, 3, 32, 32), c)  # D is at lod 3 (4x4).
    with pytest.raises(ValueError):
        G.set_lod(3.5)


def test_generator_fade_in():
    G = tiny_G().eval()
    ws = G.mapping(torch.randn(3, 16), torch.zeros(3, 0))

    def synth(lod):
        G.set_lod(lod)
        return G.synthesis(ws, noise_mode='const')

    for level in [0, 1, 2]:  # Fading in 32, 16 and 8.
        new, prev_up = synth(level), nearest_up(synth(level + 1))
        for frac in [0.25, 0.5]:
            torch.testing.assert_close(synth(level + frac), (1 - frac) * new + frac * prev_up, rtol=1e-5, atol=1e-5)
        # alpha = 0 (start of the fade-in): the upsampled output of the previous level.
        torch.testing.assert_close(synth(level + 1 - 2 ** -30), prev_up, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_output_tanh_bounds_the_blended_image():
    """output_tanh=True gives tanh of the linear G's image, taken after a fade-in's blend (not of each level)."""
    linear, bounded = tiny_G().eval(), tiny_G(output_tanh=True).eval()  # Same seed: same weights.
    ws = linear.mapping(torch.randn(3, 16), torch.zeros(3, 0))

    def synth(G, lod):
        G.set_lod(lod)
        return G.synthesis(ws, noise_mode='const').double()

    for lod in [0, 0.5, 1.25, 2]:
        expected = torch.from_numpy(np.tanh(synth(linear, lod).numpy()))
        torch.testing.assert_close(synth(bounded, lod), expected, rtol=1e-6, atol=1e-6)
    blend_of_tanh = 0.5 * np.tanh(synth(linear, 0).numpy()) + 0.5 * np.tanh(nearest_up(synth(linear, 1)).numpy())
    assert np.abs(synth(bounded, 0.5).numpy() - blend_of_tanh).max() > 1e-2  # The two orders differ here.


def test_discriminator_fade_in_start_sees_previous_level():
    D = tiny_D()
    img, c = torch.randn(4, 3, 16, 16), torch.zeros(4, 0)
    D.set_lod(2)
    previous = D(F.avg_pool2d(img, 2), c)  # 8x8 level with the 2x2-averaged image.
    D.set_lod(2 - 2 ** -30)  # 16x16 level fading in, alpha ~ 0.
    torch.testing.assert_close(D(img, c), previous, rtol=1e-5, atol=1e-5)
    D.set_lod(1.5)
    assert not torch.allclose(D(img, c), previous)

#----------------------------------------------------------------------------
# Mapping: truncation, w_avg, style mixing.


def test_truncation():
    G = tiny_G().eval()
    with torch.no_grad():
        G.mapping.w_avg.normal_()
    z, c = torch.randn(5, 16), torch.zeros(5, 0)
    ws = G.mapping(z, c)
    torch.testing.assert_close(G.mapping(z, c, truncation_psi=0), G.mapping.w_avg.expand(5, G.num_ws, 16))
    half = G.mapping(z, c, truncation_psi=0.5, truncation_cutoff=3)
    torch.testing.assert_close(half[:, :3], G.mapping.w_avg + 0.5 * (ws[:, :3] - G.mapping.w_avg))
    torch.testing.assert_close(half[:, 3:], ws[:, 3:])


def test_w_avg_tracked_in_training_only():
    G = tiny_G()
    z, c = torch.randn(6, 16), torch.zeros(6, 0)
    w = G.mapping(z, c, update_w_avg=False)[:, 0].detach()
    before = torch.randn(16)
    G.mapping.w_avg.copy_(before)
    G.eval()(z, c)
    torch.testing.assert_close(G.mapping.w_avg, before)
    G.train()(z, c)
    torch.testing.assert_close(G.mapping.w_avg, 0.995 * before + 0.005 * w.mean(dim=0))


def test_style_mixing_changes_only_layers_after_crossover():
    G = tiny_G(img_resolution=16, style_mixing_prob=1.0).train()
    captured = []
    G.synthesis.register_forward_pre_hook(lambda module, args: captured.append(args[0].detach().clone()))
    z, c = torch.randn(3, 16), torch.zeros(3, 0)
    own = G.mapping(z, c, update_w_avg=False)
    for lod, active in [(0, 6), (1.5, 4)]:  # 6 styles at 16x16; 4 in use while 8x8 fades in.
        G.set_lod(lod)
        cutoffs = set()
        for seed in range(12):
            torch.manual_seed(seed)
            G(z, c)
            ws = captured.pop()
            same = [torch.equal(ws[:, i], own[:, i]) for i in range(G.num_ws)]
            cutoff = same.index(False)
            assert all(same[:cutoff]) and not any(same[cutoff:])
            assert 1 <= cutoff < active
            assert all(torch.equal(ws[:, i], ws[:, cutoff]) for i in range(cutoff, G.num_ws))  # One second latent.
            cutoffs.add(cutoff)
        assert len(cutoffs) > 1
    G.eval()(z, c)
    assert torch.equal(captured.pop(), own)


def test_style_mixing_distribution():
    """P(no mixing) = 1 - style_mixing_prob; the crossover uniform on 1 .. active layers - 1 (as in v1), with the
    frequencies of 4000 draws within 4.5 binomial standard deviations."""
    prob, draws = 0.6, 4000
    G = tiny_G(img_resolution=16, style_mixing_prob=prob).train()
    z, c = torch.randn(draws, 16), torch.zeros(draws, 0)
    for lod, active in [(0, 6), (1.5, 4)]:
        G.set_lod(lod)
        torch.manual_seed(0)
        own = torch.zeros(1, G.num_ws, 16)
        counts = np.zeros(G.num_ws + 1)
        for i in range(draws):
            mixed = G._mix_styles(own, z[i:i + 1], c[i:i + 1])
            from_second = (mixed != 0).any(dim=2)[0].numpy()
            cutoff = int(np.argmax(from_second)) if from_second.any() else G.num_ws
            assert from_second[cutoff:].all()
            counts[cutoff] += 1
        expected = np.zeros(G.num_ws + 1)
        expected[1:active] = prob / (active - 1)
        expected[G.num_ws] = 1 - prob
        sd = np.sqrt(expected * (1 - expected) / draws)
        np.testing.assert_array_less(np.abs(counts / draws - expected), 4.5 * sd + 1e-12)


def test_conditional_networks():
    G, D = tiny_G(c_dim=3).eval(), tiny_D(c_dim=3)
    z = torch.randn(4, 16)
    c0, c1 = F.one_hot(torch.tensor([0, 0, 0, 0]), 3).float(), F.one_hot(torch.tensor([1, 1, 1, 1]), 3).float()
    img = G(z, c0, noise_mode='const')
    assert img.shape == (4, 3, 32, 32)
    assert not torch.allclose(img, G(z, c1, noise_mode='const'))
    # D's logit is the output unit of the given class.
    assert not torch.allclose(D(img, c0), D(img, c1))
    torch.testing.assert_close(D(img, 0.25 * c0 + 0.75 * c1), 0.25 * D(img, c0) + 0.75 * D(img, c1))

#----------------------------------------------------------------------------
# Training steps and snapshots.


@pytest.mark.parametrize('lod', [1, 0.5, 0])  # 8x8, 16x16 fading in, 16x16.
def test_gn_hinge_steps(lod):
    G, D = tiny_G(img_resolution=16).train(), tiny_D(img_resolution=16).train()
    for net in (G, D):
        net.set_lod(lod)
    loss = loss_lib.GANLoss(G=G, D=D, loss='hinge', norm='gn')
    assert not loss.fast_g  # Minibatch stddev: D is not piecewise linear, so G takes the exact double backward.
    size = 16 >> math.floor(lod)
    real, c = torch.rand(4, 3, size, size) * 2 - 1, torch.zeros(4, 0)
    collector = training_stats.Collector(regex='Loss/.*')
    collector.update()
    for phase, net in [('D', D), ('G', G)]:
        net.requires_grad_(True)
        before = [p.detach().clone() for p in net.parameters()]
        opt = torch.optim.Adam(net.parameters(), lr=1e-3, betas=(0.0, 0.99), eps=1e-8)
        loss.accumulate_gradients(phase, real, c, torch.randn(4, 16), c)
        grads = [p.grad for p in net.parameters() if p.grad is not None]
        assert grads and all(torch.isfinite(g).all() for g in grads)
        opt.step()
        net.requires_grad_(False)
        changed = [not torch.equal(p, b) for p, b in zip(net.parameters(), before)]
        assert sum(changed) > len(changed) // 2
    collector.update()
    for name in ['Loss/D/loss', 'Loss/G/loss']:
        assert collector.num(name) == 1 and math.isfinite(collector.mean(name))  # NaN/Inf are not counted.
    assert abs(collector.mean('Loss/G/loss')) <= 1  # -f_hat with |f_hat| <= 1.


def test_spectral_norm_discriminator():
    D = tiny_D(img_resolution=8, spectral_norm=True)
    assert D(torch.randn(4, 3, 8, 8), torch.zeros(4, 0)).shape == (4, 1)
    conv = D.b8.conv0
    sigma = torch.linalg.matrix_norm(conv.weight.flatten(1), ord=2)
    assert sigma.item() == pytest.approx(1, rel=0.1)  # Power-iteration estimate after one forward.


def test_snapshot_round_trip_keeps_lod(tmp_path):
    G, D = tiny_G(img_resolution=16).eval(), tiny_D(img_resolution=16)
    G.set_lod(0.75)
    D.set_lod(0.75)
    path = str(tmp_path / 'snapshot.pkl')
    persistence.save_snapshot(path, dict(G=G, D=D))
    data = persistence.load_snapshot(path)
    assert float(data.G.synthesis.lod) == 0.75 and float(data.D.lod) == 0.75
    z, c = torch.randn(4, 16), torch.zeros(4, 0)
    torch.testing.assert_close(data.G(z, c, noise_mode='const'), G(z, c, noise_mode='const'))
    img = G(z, c, noise_mode='const')
    torch.testing.assert_close(data.D(img, c), D(img, c))

#----------------------------------------------------------------------------
# GN on the image D actually sees: StyleGAN v1 feeds D the full-resolution image.


def full_resolution_gn(D, x_R, c, s):
    """f, ||grad_x f|| and f_hat w.r.t. v1's full-resolution input x = nearest_up(x_R, s), with D applied to
    an explicit s x s box average of x (what v1's D computes before its first layer in use)."""
    x = nearest_up(x_R, s).detach().requires_grad_(True) if s > 1 else x_R.detach().requires_grad_(True)
    f = D(F.avg_pool2d(x, s) if s > 1 else x, c)
    grad, = torch.autograd.grad(f.sum(), x)
    n = grad.flatten(1).norm(dim=1, keepdim=True)
    return f.detach(), n, f.detach() / (n + f.detach().abs())


def fade_reals(x_full, lod):
    """What D receives at lod, built by hand: box average to R = 32 / 2**floor(lod), then the fade-in blend."""
    x = F.avg_pool2d(x_full, 2 ** math.floor(lod)) if lod >= 1 else x_full
    frac = lod - math.floor(lod)
    return torch.lerp(x, nearest_up(F.avg_pool2d(x, 2)), frac) if frac > 0 else x


@pytest.mark.parametrize('lod', [0, 0.5, 1, 1.75, 2, 2.25, 3])
def test_gn_norm_is_the_full_resolution_one(lod, monkeypatch):
    D = tiny_D(img_resolution=32).double()
    D.set_lod(lod)
    s = 2 ** math.floor(lod)
    torch.manual_seed(2)
    x_R = fade_reals(torch.rand(4, 3, 32, 32, dtype=torch.float64) * 2 - 1, lod)
    c = torch.zeros(4, 0, dtype=torch.float64)
    f, n_full, f_hat = full_resolution_gn(D, x_R, c, s)
    assert D.input_grad_scale == 1 / s

    # GN: the norm and f_hat of the loss are the full-resolution ones.
    loss = loss_lib.GANLoss(G=torch.nn.Identity(), D=D, norm='gn')
    scores, grad_norm = loss.scores(x_R, c)
    torch.testing.assert_close(grad_norm, n_full, rtol=1e-10, atol=0)
    torch.testing.assert_close(scores, f_hat, rtol=1e-10, atol=0)

    # R1: the penalty's norm too (G(z, c) = z hands the fakes through).
    reported = {}
    monkeypatch.setattr(training_stats, 'report', lambda name, value: reported.setdefault(name, value))
    r1 = loss_lib.GANLoss(G=lambda z, c: z, D=D, loss='hinge', norm='r1', r1_gamma=1.0)
    D.requires_grad_(True)
    r1.accumulate_gradients('D', x_R, c, x_R.flip(0), c)
    torch.testing.assert_close(reported['Loss/grad_norm'].detach(), n_full, rtol=1e-10, atol=0)


def test_gn_is_continuous_across_every_fade_in_boundary():
    # At an integer lod L, D works at R; just below it (lod L - eps) it works at 2R at the very start of
    # the fade-in, where its input is (nearly) the upsampled R image: f_hat must not jump.
    D = tiny_D(img_resolution=32).double()
    loss = loss_lib.GANLoss(G=torch.nn.Identity(), D=D, norm='gn')
    torch.manual_seed(3)
    x_full = torch.rand(4, 3, 32, 32, dtype=torch.float64) * 2 - 1
    c = torch.zeros(4, 0, dtype=torch.float64)
    for L in [1, 2, 3]:
        results = []
        for lod in [L, L - 1e-9]:
            D.set_lod(lod)
            results.append(loss.scores(fade_reals(x_full, lod), c))
        (at, n_at), (below, n_below) = results
        torch.testing.assert_close(n_below, n_at, rtol=1e-6, atol=0)
        torch.testing.assert_close(below, at, rtol=1e-6, atol=0)


def test_lod_on_the_host_follows_every_change_of_the_buffer():
    """The host copy of lod (no GPU sync per forward) must follow set_lod, state-dict loading and in-place copies."""
    from training.networks.stylegan import host_lod
    D = stylegan.Discriminator(c_dim=0, img_resolution=32, img_channels=3, fmap_max=4)
    D.set_lod(1.5)
    assert host_lod(D) == 1.5
    D.load_state_dict({**D.state_dict(), 'lod': torch.tensor(0.25, dtype=torch.float64)})
    assert host_lod(D) == 0.25
    D.lod.copy_(torch.tensor(2.0))  # As misc.copy_params_and_buffers does on resume.
    assert host_lod(D) == 2.0 and D.input_grad_scale == 0.25
    x = torch.randn(4, 3, 8, 8)
    assert D(x, torch.zeros(4, 0)).shape == (4, 1)  # Runs at 8x8, as lod 2 asks.

#----------------------------------------------------------------------------
# Mixed precision: autocast for the convolutions, float32 where rounding matters.


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_autocast_keeps_mapping_styles_and_statistics_in_float32(dtype):
    torch.manual_seed(0)
    G, D = tiny_G(img_resolution=16), tiny_D(img_resolution=16)
    G.set_lod(0.5)
    D.set_lod(0.5)
    seen = {}
    for name, module in [('w', G.mapping), ('style', G.synthesis.b8.epi1.affine), ('conv', G.synthesis.b8.conv1),
                         ('epilogue', G.synthesis.b8.epi1), ('D conv', D.b8.conv1), ('mbstd', D.b4.mbstd)]:
        module.register_forward_hook(lambda m, i, o, name=name: seen.update({name: o.dtype}))  # Last call wins.
    with torch.autocast('cpu', dtype=dtype):
        img = G(torch.randn(4, G.z_dim), torch.zeros(4, 0))
        D(img.float(), torch.zeros(4, 0))
    assert seen == {'w': torch.float32, 'style': torch.float32, 'conv': dtype, 'epilogue': dtype, 'D conv': dtype,
                    'mbstd': dtype}
    assert G.mapping.w_avg.dtype == torch.float32 and img.dtype == dtype


@pytest.mark.parametrize('precision, D_bound, G_bound', [('bf16', 0.1, 0.3), ('fp16', 0.02, 0.1)])
def test_gn_gradients_under_autocast_against_float64(precision, D_bound, G_bound):
    """One GN D step and one G step mid fade-in, against the same step in float64: relative gradient errors of the
    size of the SN-GAN presets' (docs/precision.md), and every gradient finite. Noise strengths (0 at init: the
    noise changes no value) are left out: their gradients depend on noise that float64 and float32 draw apart."""
    torch.manual_seed(0)
    G, D = tiny_G(img_resolution=16, style_mixing_prob=0), tiny_D(img_resolution=16)
    for net in (G, D):
        net.set_lod(0.5)
    real, z, c = torch.rand(8, 3, 16, 16) * 2 - 1, torch.randn(8, G.z_dim), torch.zeros(8, 0)

    def grads(G, D, precision):
        loss = loss_lib.GANLoss(G=G, D=D, loss='hinge', norm='gn', precision=precision)
        dtype = next(D.parameters()).dtype
        out = {}
        for net, module in [('D', D), ('G', G)]:
            module.requires_grad_(True)
            loss.accumulate_gradients(net, real.to(dtype), c.to(dtype), z.to(dtype), c.to(dtype),
                                      gain=2.0 ** 8 if precision == 'fp16' else 1.0)  # Loss scaling for fp16.
            out[net] = torch.cat([p.grad.flatten().double() for name, p in module.named_parameters()
                                  if p.grad is not None and 'noise_strength' not in name])
            module.requires_grad_(False)
        return out

    import copy
    reference = grads(copy.deepcopy(G).double(), copy.deepcopy(D).double(), 'fp32')
    got = grads(G, D, precision)
    scale = 2.0 ** 8 if precision == 'fp16' else 1.0
    for net, bound in [('D', D_bound), ('G', G_bound)]:
        assert torch.isfinite(got[net]).all()
        error = ((got[net] / scale - reference[net]).norm() / reference[net].norm()).item()
        assert error < bound, (net, error)


def test_minibatch_stddev_statistics_in_float32_for_bfloat16_features():
    """Features of bf16 activations with an offset: their std over the group, computed in float64 from the very bf16
    values, is what the layer appends (rounded once to bf16); bf16 arithmetic would be off by far more."""
    torch.manual_seed(0)
    x = (30 + 0.5 * torch.randn(8, 4, 2, 2)).to(torch.bfloat16)
    out = stylegan.MinibatchStdLayer(group_size=4)(x)
    v = x.double().numpy().reshape(4, 2, 4, 2, 2)
    expected = np.sqrt(v.var(axis=0) + 1e-8).mean(axis=(1, 2, 3))  # One value per subgroup of 4.
    np.testing.assert_allclose(out[:2, 4, 0, 0].double().numpy(), expected, rtol=2 ** -8)


# Layouts of (x, lower) a fade-in meets: G's toRGB output of a one-channel image (channels-last strides with a size-1
# channel, so both contiguous and channels-last) beside the contiguous upsampled lower level; D's channels-last
# features beside contiguous ones; and plain contiguous inputs.
FADE_IN_LAYOUTS = {
    'contiguous': lambda t: t,
    'one-channel': lambda t: t[:, :1].contiguous(memory_format=torch.channels_last).as_strided(
        (t.shape[0], 1, *t.shape[2:]), (t.shape[2] * t.shape[3], 1, t.shape[3], 1)),
    'channels-last': lambda t: t.contiguous(memory_format=torch.channels_last),
}


@pytest.mark.parametrize('layout', list(FADE_IN_LAYOUTS))
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize('lod', [0.75, 2 / 3, 1.1, 0.001, 0.999])
def test_fade_in_from_the_lod_buffer_is_lerp_by_a_python_float(lod, dtype, layout):
    """fade_in reads the fade-in's progress from the lod buffer (so that a captured step follows it) and must give
    what torch.lerp with the progress as a Python float gives, bit for bit: values, their layout in memory (the
    convolutions after it round by it), gradients of both inputs and a second derivative (GN's D step differentiates
    twice)."""
    module = stylegan.Discriminator(c_dim=0, img_resolution=16, img_channels=3, fmap_max=4)
    module.set_lod(lod)
    frac = lod - math.floor(lod)
    torch.manual_seed(0)
    x0 = FADE_IN_LAYOUTS[layout](torch.randn(2, 3, 4, 4, dtype=torch.float64).to(dtype))
    lower0 = torch.randn(*x0.shape, dtype=torch.float64).to(dtype)
    results = []
    for fade in (lambda x, lower: stylegan.fade_in(module, x, lower), lambda x, lower: torch.lerp(x, lower, frac)):
        x, lower = x0.clone().requires_grad_(True), lower0.clone().requires_grad_(True)
        out = fade(x, lower)
        grad_x, grad_lower = torch.autograd.grad((out.float() ** 2).sum(), [x, lower], create_graph=True)
        second, = torch.autograd.grad((grad_x.float() ** 3).sum() + grad_lower.float().sum(), x)
        results.append([out, grad_x, grad_lower, second])
    for got, expected in zip(*results):
        assert got.dtype == expected.dtype and got.stride() == expected.stride() and torch.equal(got, expected)
