"""--cfg presets: the paper's settings (GN-GAN paper, appendix; the authors' release), the overrides, and networks that build from them."""

import pytest
import torch

import dnnlib
from training.configs import get_config
from training.loss import GANLoss

KEYS = {'name', 'description', 'G_kwargs', 'D_kwargs', 'loss_kwargs', 'G_opt_kwargs', 'D_opt_kwargs', 'n_dis',
        'batch_D', 'batch_G', 'total_steps', 'lr_decay', 'ema_beta', 'ema_start', 'z_dim', 'conditional', 'resolution',
        'arch'}

# name: (loss, lr_G, lr_D, betas, n_dis, batch_D, batch_G, total_steps, lr_decay, ema_beta, resolution, G params, D params)
EXPECTED = {
    'cifar10-cnn':        ('ns',    2e-4, 2e-4, [0.0, 0.9],   1, 64, 128, 200_000, 'none',   None,   32,  3_813_379,  5_860_865),
    'cifar10-resnet':     ('hinge', 2e-4, 4e-4, [0.0, 0.9],   5, 64, 128, 200_000, 'linear', None,   32,  4_276_739,  1_053_825),
    'stl10-cnn':          ('ns',    2e-4, 2e-4, [0.0, 0.9],   1, 64, 128, 200_000, 'none',   None,   48,  5_134_339,  5_871_105),
    'stl10-resnet':       ('hinge', 2e-4, 4e-4, [0.0, 0.9],   5, 64, 128, 200_000, 'linear', None,   48,  4_878_083,  4_859_073),
    'cifar10-biggan':     ('hinge', 1e-4, 2e-4, [0.0, 0.999], 4, 50, 50,  125_000, 'none',   0.9999, 32,  4_304_387,  4_207_361),
    'celebahq128-resnet': ('hinge', 2e-4, 2e-4, [0.0, 0.9],   5, 64, 128, 100_000, 'linear', 0.9999, 128, 32_150_787, 38_419_137),
    'celebahq256-resnet': ('hinge', 2e-4, 2e-4, [0.0, 0.9],   5, 64, 128, 100_000, 'linear', 0.9999, 256, 37_135_107, 43_401_409),
    'church256-resnet':   ('hinge', 2e-4, 2e-4, [0.0, 0.9],   5, 64, 128, 100_000, 'linear', 0.9999, 256, 37_135_107, 43_401_409),
}


@pytest.mark.parametrize('name', list(EXPECTED))
def test_preset_matches_paper(name):
    loss, lr_G, lr_D, betas, n_dis, batch_D, batch_G, steps, decay, ema, res, G_count, D_count = EXPECTED[name]
    cfg = get_config(name)
    assert isinstance(cfg, dnnlib.EasyDict) and set(cfg) == KEYS
    assert cfg.name == name and cfg.description and '\n' not in cfg.description
    assert cfg.loss_kwargs == dict(class_name='training.loss.GANLoss', loss=loss, norm='gn', cr=0.0)
    assert cfg.G_opt_kwargs == dict(class_name='torch.optim.Adam', lr=lr_G, betas=betas, eps=1e-8)
    assert cfg.D_opt_kwargs == dict(class_name='torch.optim.Adam', lr=lr_D, betas=betas, eps=1e-8)
    assert (cfg.n_dis, cfg.batch_D, cfg.batch_G, cfg.total_steps, cfg.lr_decay) == (n_dis, batch_D, batch_G, steps, decay)
    assert cfg.ema_beta == ema and cfg.resolution == res and cfg.z_dim == 128
    assert cfg.conditional == (name == 'cifar10-biggan')
    assert cfg.D_kwargs.spectral_norm is False

    # The networks the preset names have the paper's parameter counts.
    c_dim = 10 if cfg.conditional else 0
    with torch.device('meta'):
        G = dnnlib.util.construct_class_by_name(**cfg.G_kwargs, c_dim=c_dim, img_resolution=res, img_channels=3)
        D = dnnlib.util.construct_class_by_name(**cfg.D_kwargs, c_dim=c_dim, img_resolution=res, img_channels=3)
    assert sum(p.numel() for p in G.parameters()) == G_count
    assert sum(p.numel() for p in D.parameters()) == D_count
    assert isinstance(dnnlib.util.construct_class_by_name(**cfg.loss_kwargs, G=G, D=D), GANLoss)


def test_ema_start():
    assert get_config('cifar10-biggan').ema_start == 1000
    assert get_config('celebahq128-resnet').ema_start == 10_000
    assert get_config('church256-resnet').ema_start == 20_000


def test_overrides():
    cfg = get_config('cifar10-resnet', norm='sn', loss='ns-nosigmoid', cr=5)
    assert cfg.D_kwargs.spectral_norm is True
    assert (cfg.loss_kwargs.norm, cfg.loss_kwargs.loss, cfg.loss_kwargs.cr) == ('sn', 'ns-nosigmoid', 5.0)
    for norm in ['gn', 'gn1', 'gn0', 'gp1', 'gp0', 'r1', 'none']:
        cfg = get_config('stl10-cnn', norm=norm)
        assert cfg.D_kwargs.spectral_norm is False and cfg.loss_kwargs.norm == norm


def test_presets_are_independent_copies():
    cfg = get_config('cifar10-cnn')
    cfg.G_opt_kwargs.betas.append(1.0)
    assert get_config('cifar10-cnn').G_opt_kwargs.betas == [0.0, 0.9]


def test_unknown_values_raise_with_valid_names():
    with pytest.raises(ValueError, match='cifar10-resnet'):
        get_config('cifar100-resnet')
    with pytest.raises(ValueError, match='gn1'):
        get_config('cifar10-cnn', norm='spectral')
    with pytest.raises(ValueError, match='wasserstein'):
        get_config('cifar10-cnn', loss='wgan')
    with pytest.raises(ValueError):
        get_config('cifar10-cnn', cr=-1)

#----------------------------------------------------------------------------
# training_options: a preset completed for a dataset and the command line's overrides.


def test_training_options_fixed_preset_overrides():
    from training.configs import training_options
    cfg = get_config('cifar10-resnet')
    opts = training_options(cfg, resolution=32, channels=3, label_dim=10, num_gpus=2, batch=32, batch_gpu=8, kimg=16)
    s = opts.schedule_kwargs
    # --batch=32 sets M = 32 and G keeps the ratio 2M; 16 kimg of reals at 5 D steps of 32 = 100 G steps.
    assert (s.batch_D, s.batch_G, s.total_steps, s.num_gpus, s.batch_gpu) == (32, 64, 100, 2, 8)
    assert opts.G_kwargs.c_dim == 0 and opts.G_kwargs.img_resolution == 32  # Unconditional preset: labels unused.
    assert training_options(cfg, resolution=32, channels=3, label_dim=0, steps=7).schedule_kwargs.total_steps == 7
    biggan = training_options(get_config('cifar10-biggan'), resolution=32, channels=3, label_dim=10)
    assert biggan.G_kwargs.c_dim == 10 and biggan.D_kwargs.c_dim == 10


def test_training_options_progressive():
    from training.configs import training_options
    opts = training_options(get_config('gn-stylegan'), resolution=256, channels=3, label_dim=0, max_resolution=128,
                            cmax=64, lod_kimg=10, kimg=100, batch=16, num_gpus=4)
    s = opts.schedule_kwargs
    assert (s.max_resolution, s.phase_kimg, s.fade_kimg, s.total_kimg, s.max_batch, s.num_gpus, s.group_size) == \
        (128, 10, 10, 100, 16, 4, 4)
    assert opts.G_kwargs.fmap_max == opts.D_kwargs.fmap_max == 64 and opts.G_kwargs.img_resolution == 128


@pytest.mark.parametrize('name, kwargs, message', [
    ('cifar10-resnet', dict(steps=3, kimg=1), 'not both'),
    ('cifar10-resnet', dict(resolution=48), 'built for 32x32'),
    ('cifar10-resnet', dict(cmax=8), 'gn-stylegan only'),
    ('cifar10-biggan', dict(label_dim=0), 'class-conditional'),
    ('cifar10-resnet', dict(num_gpus=3), 'not divisible by --gpus=3'),
    ('gn-stylegan', dict(steps=3), '--kimg, not --steps'),
    ('gn-stylegan', dict(max_resolution=64), 'exceeds'),
    ('gn-stylegan', dict(resolution=48), 'power-of-two'),
    ('gn-stylegan', dict(batch_gpu=2), 'whole groups of 4'),
    ('gn-stylegan', dict(precision='bf16'), 'do not run under autocast'),
    ('cifar10-cnn', dict(precision='fp8'), 'unknown precision'),
])
def test_training_options_refuses_bad_combinations(name, kwargs, message):
    from training.configs import training_options
    args = dict(resolution=32, channels=3, label_dim=0) | kwargs
    with pytest.raises(ValueError, match=message):
        training_options(get_config(name), **args)
