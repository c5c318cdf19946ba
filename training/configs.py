"""The --cfg presets: the paper's training settings for each dataset and architecture, as data.

`get_config(name)` returns an EasyDict that `training_options` reads:

    name, description       preset name and a one-line summary
    G_kwargs, D_kwargs      class_name + constructor kwargs, without c_dim / img_resolution / img_channels
                            (training_options fills those in from the dataset)
    loss_kwargs             class_name='training.loss.GANLoss' + loss / norm / cr / ...
    G_opt_kwargs, D_opt_kwargs   class_name='torch.optim.Adam' + lr, betas, eps
    n_dis                   D steps per G step
    batch_D, batch_G        global batch of a D step (M) and of a G step (2M, or M for BigGAN)
    total_steps             training length in G steps
    lr_decay                'linear' (to 0 over total_steps) or 'none'
    ema_beta, ema_start     G EMA decay per G step (None = no EMA) and the G step from which it averages
                            (before it the EMA copy just follows G)
    resolution              expected dataset resolution (a preset without one takes any)
    (gn-stylegan has no batch_D, batch_G, total_steps, ema_beta, ema_start or resolution: its
    schedule, training/progressive.py, sets them by resolution, for any power-of-two data)
    z_dim                   latent size
    conditional             True: class-conditional, the dataset must have labels; False: labels unused;
                            'if-labels': class-conditional exactly when the dataset has labels
    xflip                   random horizontal flips of the real images (all of the paper's presets)

`training_options(cfg, ...)` completes a preset for a dataset and the command line's overrides
and returns what the training loop takes: network, optimizer and loss kwargs, the kwargs of the
run's schedule (training/schedule.py), the precision and the x-flip setting.

Settings follow the GN-GAN paper and the authors' release (Adam; D batch M, G batch 2M). Every
preset takes the --norm, --loss and --cr overrides; --norm=sn turns on D's spectral normalization.
"""

from __future__ import annotations

import copy

import dnnlib
from training import progressive
from training.loss import CONSTRAINTS, LOSSES, NORMS
from training.precision import PRECISIONS, check_choice

#----------------------------------------------------------------------------

ARCHS = {
    'cnn':    ('training.networks.sngan.CNNGenerator',      'training.networks.sngan.CNNDiscriminator'),
    'resnet': ('training.networks.sngan.ResNetGenerator',   'training.networks.sngan.ResNetDiscriminator'),
    'biggan': ('training.networks.biggan.BigGANGenerator',  'training.networks.biggan.BigGANDiscriminator'),
    'stylegan': ('training.networks.stylegan.Generator',    'training.networks.stylegan.Discriminator'),
}

_SNGAN_SMALL = dict(z_dim=128, betas=[0.0, 0.9], batch_D=64, batch_G=128, total_steps=200_000, ema_beta=None,
                    ema_start=0, conditional=False)
_SNGAN_LARGE = dict(arch='resnet', z_dim=128, loss='hinge', lr_G=2e-4, lr_D=2e-4, betas=[0.0, 0.9], n_dis=5,
                    batch_D=64, batch_G=128, total_steps=100_000, lr_decay='linear', ema_beta=0.9999, conditional=False)

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
    # StyleGAN v1 with progressive growing; batch, lr and resolution follow training/progressive.py.
    'gn-stylegan':        dict(arch='stylegan', z_dim=512, loss='hinge', lr_G=progressive.LR[8], lr_D=progressive.LR[8],
                               betas=[0.0, 0.99], n_dis=1, lr_decay='none', conditional=False, D_args=dict(mbstd_group_size=4),
                               description='StyleGAN v1, progressive growing 8x8 -> full resolution, hinge loss, '
                                           'GN instead of R1, 25M images'),
    # Not from the paper: the README's first command, minutes on a 2-core CPU; how it was chosen: docs/results-notes.md.
    'quickstart':         dict(_SNGAN_SMALL, arch='cnn', resolution=32, loss='hinge', lr_G=2e-3, lr_D=2e-3, n_dis=1,
                               batch_D=16, batch_G=32, total_steps=5000, lr_decay='linear', ema_beta=0.995,
                               ema_start=500, G_args=dict(ch=16), D_args=dict(ch=8), xflip=False, conditional='if-labels',
                               description='Quick start (not from the paper): SN-GAN CNN, G width 16, D width 8, '
                                           'class-conditional when the data has labels (projection D), hinge loss, '
                                           'lr 2e-3 with linear decay, batch 16 / 32, 5k G steps, G EMA 0.995 from '
                                           'step 500, no x-flips (mirrored digits are not digits)'),
}


def get_config(name: str, norm: str | None = None, loss: str | None = None, cr: float | None = None) -> dnnlib.EasyDict:
    """The preset `name` with optional overrides: norm (default 'gn'), loss (default: the preset's), cr (default 0)."""
    if name not in PRESETS:
        raise ValueError(f'unknown config "{name}"; valid: {", ".join(PRESETS)}')
    preset = copy.deepcopy(PRESETS[name])
    norm = 'gn' if norm is None else norm
    loss = preset['loss'] if loss is None else loss
    cr = 0.0 if cr is None else float(cr)
    check_choice('norm', norm, NORMS)
    check_choice('loss', loss, LOSSES)
    if cr < 0:
        raise ValueError(f'cr must be non-negative, got {cr}')

    G_class, D_class = ARCHS[preset['arch']]
    cfg = dnnlib.EasyDict(name=name, description=preset['description'], arch=preset['arch'])
    cfg.G_kwargs = dnnlib.EasyDict(class_name=G_class, z_dim=preset['z_dim'], **preset.get('G_args', {}))
    cfg.D_kwargs = dnnlib.EasyDict(class_name=D_class, spectral_norm=CONSTRAINTS[norm].spectral_norm, **preset.get('D_args', {}))
    cfg.loss_kwargs = dnnlib.EasyDict(class_name='training.loss.GANLoss', loss=loss, norm=norm, cr=cr)
    cfg.G_opt_kwargs = dnnlib.EasyDict(class_name='torch.optim.Adam', lr=preset['lr_G'], betas=preset['betas'], eps=1e-8)
    cfg.D_opt_kwargs = dnnlib.EasyDict(class_name='torch.optim.Adam', lr=preset['lr_D'], betas=preset['betas'], eps=1e-8)
    for key in ['n_dis', 'batch_D', 'batch_G', 'total_steps', 'lr_decay', 'ema_beta', 'ema_start', 'z_dim',
                'conditional', 'resolution']:
        if key in preset:  # gn-stylegan's schedule sets batches, length, EMA and resolution by itself.
            cfg[key] = preset[key]
    cfg.xflip = preset.get('xflip', True)  # Random horizontal flips of the reals (the paper's, for every dataset).
    return cfg


def training_options(cfg: dnnlib.EasyDict, *, resolution: int, channels: int, label_dim: int, num_gpus: int = 1,
                     batch: int | None = None, batch_gpu: int | None = None, kimg: float | None = None,
                     steps: int | None = None, max_resolution: int | None = None, cmax: int | None = None,
                     lod_kimg: float | None = None, tanh: bool = False, lr_rampdown: float | None = None,
                     precision: str = 'tf32') -> dnnlib.EasyDict:
    """The training loop's network, optimizer, loss and schedule kwargs for preset `cfg` on a dataset of
    `resolution`x`resolution` images with `channels` channels and `label_dim` classes (0: no labels),
    with the command line's overrides applied. Every check of those overrides lives here; a bad
    combination raises ValueError with a one-line message.

        batch           fixed presets: D batch M (G keeps the preset's ratio); gn-stylegan: cap on the minibatch
        batch_gpu       cap on the samples one process handles at once (the rest: accumulation rounds)
        kimg, steps     run length in thousands of real images or in G steps (fixed presets only)
        max_resolution, cmax, lod_kimg   gn-stylegan only: final resolution, feature-map cap, phase length
        tanh            gn-stylegan only: G's images through tanh (v1's are linear)
        lr_rampdown     gn-stylegan only: kimg over which the learning rates fall linearly to 0 at the run's end
        precision       arithmetic of the networks (training/loss.py): fp32, tf32, bf16, fp16
    """
    progressive_run = cfg.arch == 'stylegan'
    check_choice('precision', precision, PRECISIONS)
    if steps is not None and kimg is not None:
        raise ValueError('give --kimg or --steps, not both')
    if cfg.conditional is True and label_dim == 0:
        raise ValueError(f'--cfg={cfg.name} is class-conditional, but the dataset has no labels')
    if not progressive_run and (max_resolution is not None or cmax is not None or lod_kimg is not None or tanh
                                or lr_rampdown is not None):
        raise ValueError('--resolution, --cmax, --lod-kimg, --tanh and --lr-rampdown apply to --cfg=gn-stylegan only')
    if not progressive_run and cfg.get('resolution', resolution) != resolution:  # No resolution: any.
        raise ValueError(f'--cfg={cfg.name} is built for {cfg.resolution}x{cfg.resolution} images, '
                         f'but the dataset holds {resolution}x{resolution}')
    if progressive_run and steps is not None:
        raise ValueError(f'--cfg={cfg.name} counts its length in --kimg, not --steps')
    opts = dnnlib.EasyDict(xflip=cfg.xflip, precision=precision, G_opt_kwargs=copy.deepcopy(cfg.G_opt_kwargs),
                           D_opt_kwargs=copy.deepcopy(cfg.D_opt_kwargs), loss_kwargs=copy.deepcopy(cfg.loss_kwargs))
    common = dict(c_dim=label_dim if cfg.conditional else 0, img_channels=channels)  # 'if-labels': label_dim may be 0.

    if progressive_run:
        final = resolution if max_resolution is None else max_resolution
        if resolution & (resolution - 1):
            raise ValueError(f'progressive growing needs power-of-two images, the dataset has {resolution}x{resolution}')
        if final < progressive.START_RESOLUTION or final & (final - 1):
            raise ValueError(f'progressive growing needs a power-of-two final resolution of at least '
                             f'{progressive.START_RESOLUTION}, got {final}')
        if final > resolution:
            raise ValueError(f'--resolution={final} exceeds the dataset resolution {resolution}')
        fmap = {} if cmax is None else dict(fmap_max=cmax)
        opts.G_kwargs = dnnlib.EasyDict(cfg.G_kwargs, img_resolution=final, **common, **fmap)
        if tanh:  # Only then: a G without it keeps the kwargs of snapshots written before the option.
            opts.G_kwargs.output_tanh = True
        opts.D_kwargs = dnnlib.EasyDict(cfg.D_kwargs, img_resolution=final, **common, **fmap)
        phase = progressive.PHASE_KIMG if lod_kimg is None else lod_kimg
        opts.schedule_kwargs = dnnlib.EasyDict(
            class_name='training.schedule.ProgressiveSchedule', max_resolution=final,
            total_kimg=progressive.TOTAL_KIMG if kimg is None else kimg, phase_kimg=phase, fade_kimg=phase,
            max_batch=batch, num_gpus=num_gpus, batch_gpu=batch_gpu, group_size=cfg.D_kwargs.mbstd_group_size)
        if lr_rampdown is not None:  # Only then: the schedule kwargs of runs before the option stay as they were.
            opts.schedule_kwargs.lr_rampdown_kimg = lr_rampdown
    else:
        opts.G_kwargs = dnnlib.EasyDict(cfg.G_kwargs, img_resolution=resolution, **common)
        opts.D_kwargs = dnnlib.EasyDict(cfg.D_kwargs, img_resolution=resolution, **common)
        batch_D = cfg.batch_D if batch is None else batch
        batch_G = cfg.batch_G if batch is None else max(1, cfg.batch_G * batch // cfg.batch_D)
        total_steps = cfg.total_steps if steps is None else steps
        if kimg is not None:
            total_steps = max(1, round(kimg * 1000 / (cfg.n_dis * batch_D)))
        opts.schedule_kwargs = dnnlib.EasyDict(
            class_name='training.schedule.FixedSchedule', batch_D=batch_D, batch_G=batch_G, n_dis=cfg.n_dis,
            lr_G=cfg.G_opt_kwargs.lr, lr_D=cfg.D_opt_kwargs.lr, total_steps=total_steps, lr_decay=cfg.lr_decay,
            ema_beta=cfg.ema_beta, ema_start=cfg.ema_start, num_gpus=num_gpus, batch_gpu=batch_gpu)
    dnnlib.util.construct_class_by_name(**opts.schedule_kwargs)  # Checks batch sizes against --gpus / --batch-gpu.
    return opts
