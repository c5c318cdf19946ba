"""--cfg presets: the GN-GAN authors' released training flags, the overrides, and networks that build from them."""

import pytest
import torch

import dnnlib
from training.recipes.configs import get_config
from training.step.loss import GANLoss

KEYS = {'name', 'description', 'G_kwargs', 'D_kwargs', 'loss_kwargs', 'G_opt_kwargs', 'D_opt_kwargs', 'n_dis',
        'batch_D', 'batch_G', 'total_steps', 'lr_decay', 'ema_beta', 'ema_start', 'z_dim', 'conditional', 'resolution',
        'arch', 'xflip'}

# The training flags of the authors' release (basiclab/GNGAN-PyTorch, config/GN-GAN_<name>.txt), quoted verbatim
# without the data-loading, logging and evaluation flags. Flags a file leaves out take the defaults of the release's train.py:
# --loss=hinge --lr_decay_start=0 --betas=0.0 --betas=0.9 --n_classes=1 (lr decays linearly to 0 from
# lr_decay_start to total_steps, so lr_decay_start=total_steps means no decay).
RELEASE = {
    'cifar10-cnn':        ('CIFAR10_CNN', '--dataset=cifar10.32 --arch=dcgan.32 --loss=bce --total_steps=200000 --lr_decay_start=200000 '
                           '--batch_size_D=64 --batch_size_G=128 --lr_D=0.0002 --lr_G=0.0002 --n_dis=1 --z_dim=128 --cr=0 '
                           '--n_classes=1 --ema_decay=0.9999 --ema_start=0'),
    'cifar10-resnet':     ('CIFAR10_RES', '--dataset=cifar10.32 --arch=resnet.32 --loss=hinge --total_steps=200000 --lr_decay_start=0 '
                           '--batch_size_D=64 --batch_size_G=128 --lr_D=0.0004 --lr_G=0.0002 --n_dis=5 --z_dim=128 --cr=0 '
                           '--n_classes=1 --ema_decay=0.9999 --ema_start=0'),
    'stl10-cnn':          ('STL10_CNN', '--dataset=stl10.48 --arch=dcgan.48 --loss=bce --total_steps=200000 --lr_decay_start=200000 '
                           '--batch_size_D=64 --batch_size_G=128 --lr_D=0.0002 --lr_G=0.0002 --n_dis=1 --z_dim=128 --cr=0 '
                           '--n_classes=1 --ema_decay=0.9999 --ema_start=0'),
    'stl10-resnet':       ('STL10_RES', '--dataset=stl10.48 --arch=resnet.48 --loss=hinge --total_steps=200000 --lr_decay_start=0 '
                           '--batch_size_D=64 --batch_size_G=128 --lr_D=0.0004 --lr_G=0.0002 --n_dis=5 --z_dim=128 --cr=0 '
                           '--n_classes=1 --ema_decay=0.9999 --ema_start=0'),
    'cifar10-biggan':     ('CIFAR10_BIGGAN', '--dataset=cifar10.32 --arch=biggan.32 --loss=hinge --total_steps=125000 '
                           '--lr_decay_start=125000 --batch_size_D=50 --batch_size_G=50 --lr_D=0.0002 --lr_G=0.0001 --betas=0.0 '
                           '--betas=0.999 --n_dis=4 --z_dim=128 --cr=0 --n_classes=10 --ema_decay=0.9999 --ema_start=1000'),
    'celebahq128-resnet': ('CELEBAHQ128_RES', '--dataset=celebahq.128 --arch=resnet.128 --total_steps=100000 --batch_size_D=64 '
                           '--batch_size_G=128 --lr_D=0.0002 --lr_G=0.0002 --n_dis=5 --z_dim=128 --ema_decay=0.9999 --ema_start=10000'),
    'celebahq256-resnet': ('CELEBAHQ256_RES', '--dataset=celebahq.256 --arch=resnet.256 --total_steps=100000 --batch_size_D=64 '
                           '--batch_size_G=128 --lr_D=0.0002 --lr_G=0.0002 --n_dis=5 --z_dim=128 --ema_decay=0.9999 --ema_start=10000'),
    'church256-resnet':   ('CHURCH256_RES', '--dataset=lsun_church.256 --arch=resnet.256 --total_steps=100000 --batch_size_D=64 '
                           '--batch_size_G=128 --lr_D=0.0002 --lr_G=0.0002 --n_dis=5 --z_dim=128 --ema_decay=0.9999 --ema_start=20000'),
}
RELEASE_DEFAULTS = dict(loss=['hinge'], lr_decay_start=['0'], betas=['0.0', '0.9'], n_classes=['1'])
# The 128/256 configs are run with the release's train_ddp.py (its README's table), whose flags have no
# --lr_decay_start and which builds no scheduler: constant learning rates, i.e. lr_decay_start=total_steps.
DDP_CONFIGS = {'celebahq128-resnet', 'celebahq256-resnet', 'church256-resnet'}
RELEASE_ARCHS = {'dcgan': 'training.networks.sngan.CNN', 'resnet': 'training.networks.sngan.ResNet',
                 'biggan': 'training.networks.biggan.BigGAN'}
RELEASE_LOSSES = {'bce': 'ns', 'hinge': 'hinge'}


def parse_flags(name):
    flags = {}
    for item in RELEASE[name][1].split():
        key, value = item[2:].split('=')
        flags.setdefault(key, []).append(value)
    if name in DDP_CONFIGS:
        flags['lr_decay_start'] = flags['total_steps']
    return dict(RELEASE_DEFAULTS, **flags)


@pytest.mark.parametrize('name', list(RELEASE))
def test_preset_matches_release(name):
    flags = parse_flags(name)
    one = lambda key: flags[key][0]
    cfg = get_config(name)
    assert isinstance(cfg, dnnlib.EasyDict) and set(cfg) == KEYS
    assert cfg.name == name and cfg.description and '\n' not in cfg.description
    assert cfg.loss_kwargs == dict(class_name='training.step.loss.GANLoss', loss=RELEASE_LOSSES[one('loss')], norm='gn', cr=0.0)
    betas = [float(b) for b in flags['betas']]
    assert cfg.G_opt_kwargs == dict(class_name='torch.optim.Adam', lr=float(one('lr_G')), betas=betas, eps=1e-8)
    assert cfg.D_opt_kwargs == dict(class_name='torch.optim.Adam', lr=float(one('lr_D')), betas=betas, eps=1e-8)
    assert (cfg.n_dis, cfg.batch_D, cfg.batch_G, cfg.total_steps, cfg.z_dim) == tuple(
        int(one(key)) for key in ['n_dis', 'batch_size_D', 'batch_size_G', 'total_steps', 'z_dim'])
    assert one('lr_decay_start') in ('0', one('total_steps'))  # Decay over the whole run, or none: what the presets offer.
    assert cfg.lr_decay == ('linear' if one('lr_decay_start') == '0' else 'none')
    if cfg.ema_beta is not None:
        assert (cfg.ema_beta, cfg.ema_start) == (float(one('ema_decay')), int(one('ema_start')))
    # else: the release also keeps a generator EMA (0.9999 from step 0) for these 32/48 presets; they train without one.
    assert cfg.conditional == (int(one('n_classes')) > 1)
    arch, resolution = one('arch').split('.')
    assert cfg.resolution == int(resolution) == int(one('dataset').split('.')[1])
    prefix = RELEASE_ARCHS[arch]
    assert cfg.G_kwargs.class_name == prefix + 'Generator' and cfg.D_kwargs.class_name == prefix + 'Discriminator'
    assert cfg.D_kwargs.spectral_norm is False

    # The networks build from the preset, with a loss around them (their parameter counts: test_sngan, test_biggan).
    c_dim = int(one('n_classes')) if cfg.conditional else 0
    with torch.device('meta'):
        G = dnnlib.util.construct_class_by_name(**cfg.G_kwargs, c_dim=c_dim, img_resolution=cfg.resolution, img_channels=3)
        D = dnnlib.util.construct_class_by_name(**cfg.D_kwargs, c_dim=c_dim, img_resolution=cfg.resolution, img_channels=3)
    assert isinstance(dnnlib.util.construct_class_by_name(**cfg.loss_kwargs, G=G, D=D), GANLoss)


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


def test_unknown_values_raise_with_valid_names_where_the_experiment_is_built():
    from training.experiment import Experiment
    with pytest.raises(ValueError, match='cifar10-resnet'):
        get_config('cifar100-resnet')
    with pytest.raises(ValueError, match='gn1'):
        Experiment.build(cfg='cifar10-cnn', norm='spectral')
    with pytest.raises(ValueError, match='wasserstein'):
        Experiment.build(cfg='cifar10-cnn', loss='wgan')
    with pytest.raises(ValueError, match='non-negative'):
        Experiment.build(cfg='cifar10-cnn', cr=-1)


def test_every_paper_preset_names_the_source_of_each_value():
    from training.recipes.configs import PRESETS, SOURCES
    named = [name for names in SOURCES for name in names]
    assert sorted(named) == sorted(set(PRESETS) - {'quickstart', 'gn-stylegan2'})  # The two not from the paper.
    for sources in SOURCES.values():
        assert list(sources) == list(next(iter(SOURCES.values())))  # The same values, in the table's order.
