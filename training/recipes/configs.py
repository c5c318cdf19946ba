"""The --cfg presets: the paper's training settings for each dataset and architecture, as data.

`get_config(name)` returns an EasyDict that training/experiment.py's `Experiment` reads:

    name, description       preset name and a one-line summary
    G_kwargs, D_kwargs      class_name + constructor kwargs, without c_dim / img_resolution / img_channels
                            (training_options fills those in from the dataset)
    loss_kwargs             class_name='training.step.loss.GANLoss' + loss / norm / cr / ...
    G_opt_kwargs, D_opt_kwargs   class_name='torch.optim.Adam' + lr, betas, eps
    n_dis                   D steps per G step
    batch_D, batch_G        global batch of a D step (M) and of a G step (2M, or M for BigGAN)
    total_steps             training length in G steps
    lr_decay                'linear' (to 0 over total_steps) or 'none'
    ema_beta, ema_start     G EMA decay per G step (None = no EMA) and the G step from which it averages
                            (before it the EMA copy just follows G)
    resolution              expected dataset resolution (a preset without one takes any)
    (gn-stylegan has no batch_D, batch_G, total_steps, ema_beta, ema_start or resolution: its
    schedule, training/recipes/progressive.py, sets them by resolution, for any power-of-two data)
    z_dim                   latent size
    conditional             True: class-conditional, the dataset must have labels; False: labels unused;
                            'if-labels': class-conditional exactly when the dataset has labels
    xflip                   random horizontal flips of the real images (all of the paper's presets)

`Experiment.build` completes a preset for a dataset and the command line's overrides; the training
loop builds the networks, optimizers, loss and schedule from the Experiment.

Settings follow the GN-GAN paper and the authors' release (Adam; D batch M, G batch 2M). Every
preset takes the --norm, --loss and --cr overrides; --norm=sn turns on D's spectral normalization.
"""

from __future__ import annotations

import copy

import dnnlib
from training.recipes import progressive
from training.step.loss import CONSTRAINTS, LOSSES, NORMS

#----------------------------------------------------------------------------

ARCHS = {
    'cnn':    ('training.networks.sngan.CNNGenerator',      'training.networks.sngan.CNNDiscriminator'),
    'resnet': ('training.networks.sngan.ResNetGenerator',   'training.networks.sngan.ResNetDiscriminator'),
    'biggan': ('training.networks.biggan.BigGANGenerator',  'training.networks.biggan.BigGANDiscriminator'),
    'stylegan': ('training.networks.stylegan.Generator',    'training.networks.stylegan.Discriminator'),
    'stylegan2': ('training.networks.stylegan2.Generator',  'training.networks.stylegan2.Discriminator'),
}

SN_STYLEGAN2_D = 'training.networks.stylegan2.SNDiscriminator'  # gn-stylegan2's D with --norm=sn.

# gn-stylegan2's sub-configurations (--sg2-cfg): NVIDIA StyleGAN2-ADA's train.py --cfg table. kimg: length; mb: global
# batch; mbstd: minibatch stddev group; fmaps: channel_base / 32768; lrate: Adam lr of G and D; gamma: R1 weight
# (--norm=r1); ema: G EMA half-life in kimg; ramp: EMA ramp-up (None: none); map: mapping layers; ref_gpus: GPUs the
# batch was split over (theirs per-GPU batch; here only the split of 'auto'). 'auto' is filled in by resolution and
# GPU count (sg2_spec). 'cifar' also turns off path length regularization and style mixing, and D is 'orig'.
SG2_SPECS = {
    'auto':      dict(ref_gpus=-1, kimg=25000,  mb=-1, mbstd=-1, fmaps=-1,  lrate=-1,     gamma=-1,   ema=-1,  ramp=0.05, map=2),
    'stylegan2': dict(ref_gpus=8,  kimg=25000,  mb=32, mbstd=4,  fmaps=1,   lrate=0.002,  gamma=10,   ema=10,  ramp=None, map=8),
    'paper256':  dict(ref_gpus=8,  kimg=25000,  mb=64, mbstd=8,  fmaps=0.5, lrate=0.0025, gamma=1,    ema=20,  ramp=None, map=8),
    'paper512':  dict(ref_gpus=8,  kimg=25000,  mb=64, mbstd=8,  fmaps=1,   lrate=0.0025, gamma=0.5,  ema=20,  ramp=None, map=8),
    'paper1024': dict(ref_gpus=8,  kimg=25000,  mb=32, mbstd=4,  fmaps=1,   lrate=0.002,  gamma=2,    ema=10,  ramp=None, map=8),
    'cifar':     dict(ref_gpus=2,  kimg=100000, mb=64, mbstd=32, fmaps=1,   lrate=0.0025, gamma=0.01, ema=500, ramp=0.05, map=2),
}
SG2_LOSS = dict(style_mixing_prob=0.9, pl_weight=2.0, pl_decay=0.01, pl_batch_shrink=2)  # NVIDIA's StyleGAN2Loss.
SG2_REG_INTERVALS = dict(G=4, D=16)  # NVIDIA's lazy regularization: path length every 4th G step, R1 every 16th D step.


def sg2_spec(name: str, resolution: int, gpus: int) -> dnnlib.EasyDict:
    """The --sg2-cfg entry `name` for images of `resolution` trained on `gpus` GPUs ('auto' as NVIDIA's train.py)."""
    dnnlib.util.check_choice('sg2_cfg', name, tuple(SG2_SPECS))
    spec = dnnlib.EasyDict(SG2_SPECS[name])
    if name == 'auto':
        spec.ref_gpus = gpus
        spec.mb = max(min(gpus * min(4096 // resolution, 32), 64), gpus)
        spec.mbstd = min(spec.mb // gpus, 4)
        spec.fmaps = 1 if resolution >= 512 else 0.5
        spec.lrate = 0.002 if resolution >= 1024 else 0.0025
        spec.gamma = 0.0002 * resolution ** 2 / spec.mb
        spec.ema = spec.mb * 10 / 32
    return spec

_SNGAN_SMALL = dict(z_dim=128, betas=[0.0, 0.9], batch_D=64, batch_G=128, total_steps=200_000, ema_beta=None,
                    ema_start=0, conditional=False)
# The large presets are the configs that the authors run with their train_ddp.py, which has no learning-rate
# scheduler: the learning rates stay constant (the paper's appendix states no decay for these runs).
_SNGAN_LARGE = dict(arch='resnet', z_dim=128, loss='hinge', lr_G=2e-4, lr_D=2e-4, betas=[0.0, 0.9], n_dis=5,
                    batch_D=64, batch_G=128, total_steps=100_000, lr_decay='none', ema_beta=0.9999, conditional=False)

PRESETS = {
    'cifar10-cnn':        dict(_SNGAN_SMALL, arch='cnn', resolution=32, loss='ns', lr_G=2e-4, lr_D=2e-4, n_dis=1, lr_decay='none',
                               description='CIFAR-10 32x32, SN-GAN standard CNN, NS loss, n_dis 1'),
    'cifar10-resnet':     dict(_SNGAN_SMALL, arch='resnet', resolution=32, loss='hinge', lr_G=2e-4, lr_D=4e-4, n_dis=5, lr_decay='linear',
                               description='CIFAR-10 32x32, SN-GAN ResNet, hinge loss, n_dis 5, linear lr decay'),
    'stl10-cnn':          dict(_SNGAN_SMALL, arch='cnn', resolution=48, loss='ns', lr_G=2e-4, lr_D=2e-4, n_dis=1, lr_decay='none',
                               description='STL-10 48x48, SN-GAN standard CNN, NS loss, n_dis 1'),
    'stl10-resnet':       dict(_SNGAN_SMALL, arch='resnet', resolution=48, loss='hinge', lr_G=2e-4, lr_D=4e-4, n_dis=5, lr_decay='linear',
                               description='STL-10 48x48, SN-GAN ResNet, hinge loss, n_dis 5, linear lr decay'),
    'cifar10-biggan':     dict(arch='biggan', resolution=32, z_dim=128, loss='hinge', lr_G=1e-4, lr_D=2e-4, betas=[0.0, 0.999], n_dis=4,
                               batch_D=50, batch_G=50, total_steps=125_000, lr_decay='none', ema_beta=0.9999, ema_start=1000,
                               conditional=True, description='CIFAR-10 32x32 class-conditional BigGAN, hinge loss, n_dis 4, G EMA'),
    'celebahq128-resnet': dict(_SNGAN_LARGE, resolution=128, ema_start=10_000,
                               description='CelebA-HQ 128x128, SN-GAN ResNet, hinge loss, n_dis 5, G EMA'),
    'celebahq256-resnet': dict(_SNGAN_LARGE, resolution=256, ema_start=10_000,
                               description='CelebA-HQ 256x256, SN-GAN ResNet, hinge loss, n_dis 5, G EMA'),
    'church256-resnet':   dict(_SNGAN_LARGE, resolution=256, ema_start=20_000,
                               description='LSUN Church 256x256, SN-GAN ResNet, hinge loss, n_dis 5, G EMA'),
    # StyleGAN v1 with progressive growing; batch, lr and resolution follow training/recipes/progressive.py.
    'gn-stylegan':        dict(arch='stylegan', z_dim=512, loss='hinge', lr_G=progressive.LR[8], lr_D=progressive.LR[8],
                               betas=[0.0, 0.99], n_dis=1, lr_decay='none', conditional=False, D_args=dict(mbstd_group_size=4),
                               description='StyleGAN v1, progressive growing 8x8 -> full resolution, hinge loss, '
                                           'GN instead of R1, 25M images'),
    # StyleGAN2 as NVIDIA's StyleGAN2-ADA trains it (--sg2-cfg picks its configuration: batch, lr, EMA, ...), GN + hinge for R1.
    'gn-stylegan2':       dict(arch='stylegan2', z_dim=512, loss='hinge', lr_G=0.0025, lr_D=0.0025, betas=[0.0, 0.99], n_dis=1,
                               lr_decay='none', conditional='if-labels', xflip=False,
                               description='StyleGAN2 (NVIDIA StyleGAN2-ADA\'s networks and configurations, --sg2-cfg), '
                                           'hinge loss, GN instead of R1, path length regularization and style mixing; '
                                           'class-conditional when the data has labels'),
    # Not from the paper: the README's first command, narrow and short enough to train in minutes on a 2-core CPU.
    'quickstart':         dict(_SNGAN_SMALL, arch='cnn', resolution=32, loss='hinge', lr_G=2e-3, lr_D=2e-3, n_dis=1,
                               batch_D=16, batch_G=32, total_steps=5000, lr_decay='linear', ema_beta=0.995,
                               ema_start=500, G_args=dict(ch=16), D_args=dict(ch=8), xflip=False, conditional='if-labels',
                               description='Quick start (not from the paper): SN-GAN CNN, G width 16, D width 8, '
                                           'class-conditional when the data has labels (projection D), hinge loss, '
                                           'lr 2e-3 with linear decay, batch 16 / 32, 5k G steps, G EMA 0.995 from '
                                           'step 500, no x-flips (mirrored digits are not digits)'),
}


# Where each preset value comes from: the paper (section, table) or the authors' release (basiclab/GNGAN-PyTorch,
# config/GN-GAN_<name>.txt and its train.py / train_ddp.py), and which we follow where they disagree.
# docs/configs.md renders it beside the presets.
_APPENDIX = 'paper, appendix "Experimental Details"'
SOURCES = {
    ('cifar10-cnn', 'stl10-cnn'): {
        'networks': 'paper, section "Unconditional Image Generation" and appendix: SN-GAN\'s standard CNN, Kaiming-normal init, zero biases',
        'loss': 'paper, section "Unconditional Image Generation" (NS loss with the standard CNN); config `--loss=bce`',
        'lr G / D': 'config `--lr_G=0.0002 --lr_D=0.0002`; **the appendix text says D 4e-4 for every unconditional run: '
                    'we follow the config**',
        'n_dis': 'config `--n_dis=1`; **the appendix text says 5: we follow the config**',
        'Adam betas': f'{_APPENDIX} (0, 0.9); the release\'s default',
        'batch D / G': f'{_APPENDIX} (M = 64); config `--batch_size_D=64 --batch_size_G=128`',
        'length': 'paper, section "Unconditional Image Generation" (200k G steps); config `--total_steps=200000`',
        'lr decay': 'config `--lr_decay_start=200000` (none); **the appendix text says linear decay to 0: we follow the config**',
        'G EMA': 'none: the release keeps an EMA but its train.py scores and keeps `net_G`',
        'x-flips': f'{_APPENDIX} (random horizontal flips for every method)',
    },
    ('cifar10-resnet', 'stl10-resnet'): {
        'networks': 'paper, appendix: SN-GAN\'s ResNet with global average pooling in place of the sum',
        'loss': 'paper, section "Unconditional Image Generation" (hinge loss with the ResNet); config `--loss=hinge`',
        'lr G / D': f'paper, section "Unconditional Image Generation" and {_APPENDIX} (2e-4 / 4e-4); config',
        'n_dis': f'{_APPENDIX} (5); config',
        'Adam betas': f'{_APPENDIX} (0, 0.9); the release\'s default',
        'batch D / G': f'{_APPENDIX} (M = 64); config `--batch_size_D=64 --batch_size_G=128`',
        'length': 'paper, section "Unconditional Image Generation" (200k G steps); config',
        'lr decay': f'{_APPENDIX} (linear to 0); config `--lr_decay_start=0`',
        'G EMA': 'none: the release keeps an EMA but its train.py scores and keeps `net_G`',
        'x-flips': _APPENDIX,
    },
    ('cifar10-biggan',): {
        'networks': 'paper, section "Conditional Image Generation" and appendix: BigGAN at 32x32, SN kept in G, GN in place of D\'s SN',
        'loss': 'the release\'s default (hinge)',
        'lr G / D': 'paper, section "Conditional Image Generation" and its appendix (1e-4 / 2e-4); config',
        'n_dis': 'paper, appendix (4); config', 'Adam betas': 'paper, appendix (0, 0.999); config',
        'batch D / G': 'paper, appendix (50); config', 'length': 'paper, appendix (125k G steps); config',
        'lr decay': 'config `--lr_decay_start=125000` (none); the paper does not say',
        'G EMA': 'paper, appendix (decay 0.9999); config `--ema_start=1000`',
        'x-flips': 'paper, appendix',
    },
    ('celebahq128-resnet', 'celebahq256-resnet', 'church256-resnet'): {
        'networks': 'paper, appendix "Unconditional Image Generation on CelebA-HQ and LSUN Church": SN-GAN\'s 256 ResNet',
        'loss': 'the release\'s default (hinge)',
        'lr G / D': 'paper, appendix (2e-4 / 2e-4); config', 'n_dis': 'paper, appendix (5); config',
        'Adam betas': 'paper, appendix (0, 0.9)', 'batch D / G': 'paper, appendix (64); config `--batch_size_G=128`',
        'length': 'paper, appendix (100k G steps); config',
        'lr decay': 'none: these configs run with the release\'s train_ddp.py, which has no scheduler; the paper does not say',
        'G EMA': 'paper, appendix (decay 0.9999); config `--ema_start` (10k for CelebA-HQ, 20k for LSUN Church)',
        'x-flips': 'paper, appendix',
    },
    ('gn-stylegan',): {
        'networks': 'paper, appendix "Experiments on Progressive Growing Architecture": StyleGAN with GN in place of R1',
        'loss': 'paper, same appendix (hinge)',
        'lr G / D': 'paper, same appendix (1e-3 up to 64x64, 1.5e-3 above)',
        'n_dis': 'StyleGAN v1 (the paper: "the same parameters as StyleGAN")', 'Adam betas': 'StyleGAN v1 (0, 0.99)',
        'batch D / G': 'StyleGAN v1\'s 8-GPU minibatch schedule', 'length': 'StyleGAN v1 (25M images)',
        'lr decay': 'StyleGAN v1 (none)', 'G EMA': 'StyleGAN v1 (half-life 10k images)', 'x-flips': 'StyleGAN v1\'s CelebA-HQ run',
    },
}


def get_config(name: str, norm: str | None = None, loss: str | None = None, cr: float | None = None) -> dnnlib.EasyDict:
    """The preset `name` with optional overrides: norm (default 'gn'), loss (default: the preset's), cr (default 0)."""
    if name not in PRESETS:
        raise ValueError(f'unknown config "{name}"; valid: {", ".join(PRESETS)}')
    preset = copy.deepcopy(PRESETS[name])
    norm = 'gn' if norm is None else norm
    loss = preset['loss'] if loss is None else loss
    cr = 0.0 if cr is None else float(cr)
    dnnlib.util.check_choice('norm', norm, NORMS)
    dnnlib.util.check_choice('loss', loss, LOSSES)
    if cr < 0:
        raise ValueError(f'cr must be non-negative, got {cr}')

    G_class, D_class = ARCHS[preset['arch']]
    cfg = dnnlib.EasyDict(name=name, description=preset['description'], arch=preset['arch'])
    cfg.G_kwargs = dnnlib.EasyDict(class_name=G_class, z_dim=preset['z_dim'], **preset.get('G_args', {}))
    cfg.D_kwargs = dnnlib.EasyDict(class_name=D_class, **preset.get('D_args', {}))
    if preset['arch'] != 'stylegan2':
        cfg.D_kwargs.spectral_norm = CONSTRAINTS[norm].spectral_norm
    elif CONSTRAINTS[norm].spectral_norm:  # NVIDIA's StyleGAN2 Discriminator keeps its constructor; SN is a subclass.
        cfg.D_kwargs.class_name = SN_STYLEGAN2_D
    cfg.loss_kwargs = dnnlib.EasyDict(class_name='training.step.loss.GANLoss', loss=loss, norm=norm, cr=cr)
    cfg.G_opt_kwargs = dnnlib.EasyDict(class_name='torch.optim.Adam', lr=preset['lr_G'], betas=preset['betas'], eps=1e-8)
    cfg.D_opt_kwargs = dnnlib.EasyDict(class_name='torch.optim.Adam', lr=preset['lr_D'], betas=preset['betas'], eps=1e-8)
    for key in ['n_dis', 'batch_D', 'batch_G', 'total_steps', 'lr_decay', 'ema_beta', 'ema_start', 'z_dim',
                'conditional', 'resolution']:
        if key in preset:  # gn-stylegan's schedule sets batches, length, EMA and resolution by itself.
            cfg[key] = preset[key]
    cfg.xflip = preset.get('xflip', True)  # Random horizontal flips of the reals (the paper's, for every dataset).
    return cfg
