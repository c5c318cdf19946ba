"""The SN-GAN family: SN-GAN's standard CNN and ResNet and BigGAN at 32x32 to 256x256, the quick start, and the
standard CNN's --act and --depth of the paper's analyses. Runs of fixed batches at the data's resolution, D batch M
and G batch 2M (BigGAN: M), n_dis D steps per G step, a learning rate constant or decaying linearly to 0.

Settings follow the GN-GAN paper and the authors' release (basiclab/GNGAN-PyTorch); SOURCES says where each value
comes from, and which one we follow where they disagree.
"""

from __future__ import annotations

from typing import Any

import dnnlib
from training.networks import biggan, sngan
from training.recipes.recipe import Recipe

#----------------------------------------------------------------------------

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
}


class SNGANRecipe(Recipe):
    """SN-GAN's CNN and ResNet, BigGAN, the quick start; the standard CNN also takes --act and --depth."""

    presets = PRESETS
    archs = {
        'cnn':    ('training.networks.sngan.CNNGenerator',      'training.networks.sngan.CNNDiscriminator'),
        'resnet': ('training.networks.sngan.ResNetGenerator',   'training.networks.sngan.ResNetDiscriminator'),
        'biggan': ('training.networks.biggan.BigGANGenerator',  'training.networks.biggan.BigGANDiscriminator'),
    }
    options = ('act', 'depth')
    owner = 'the standard-CNN presets'
    sources = SOURCES
    datasets = {
        **dict.fromkeys(('cifar10-cnn', 'cifar10-resnet', 'cifar10-biggan'), 'CIFAR-10 (python dataset_tool.py --source=cifar-10-python.tar.gz --dest=cifar10.zip)'),
        **dict.fromkeys(('stl10-cnn', 'stl10-resnet'), 'STL-10 at 48x48 (python dataset_tool.py --source=stl10_binary.tar.gz --dest=stl10-48.zip --resolution=48x48)'),
        'celebahq128-resnet': 'CelebA-HQ\'s 27k training images at 128x128 (python dataset_tool.py '
                              '--source=~/celeba-hq/train27k --dest=celebahq-128-train27k.zip --resolution=128x128)',
        'celebahq256-resnet': 'CelebA-HQ at 256x256 (python dataset_tool.py --source=~/celeba-hq/images1024x1024 '
                              '--dest=celebahq-256.zip --resolution=256x256)',
        'church256-resnet': 'LSUN Church at 256x256 (python dataset_tool.py --source=~/lsun/church_outdoor_train_lmdb '
                            '--dest=church256.zip --transform=squash --resolution=256x256)',
    }

    def takes(self, name: str) -> tuple[str, ...]:
        return self.options if self.presets[name]['arch'] == 'cnn' else ()

    def fill(self, values: dict[str, Any], given: dict[str, Any], preset: dnnlib.EasyDict) -> None:
        if 'act' in given:
            sngan.parse_activation(given['act'])  # 'unknown activation "tanh"; valid: ...'
        if 'depth' in given:
            sngan.cnn_depth_layout(given['depth'])
        self.fill_fixed(values, preset)

    def freezable(self, values: dict[str, Any]) -> tuple[int, str]:
        """The standard CNN's convolutions, the ResNet's and BigGAN's residual blocks."""
        arch = self.presets[values['cfg']]['arch']
        if arch == 'cnn':
            return values.get('depth') or sngan.STANDARD_CNN_DEPTH, 'convolutions'
        if arch == 'resnet':
            return len(sngan.resnet_layout(values['img_resolution'])['D_mult']), 'residual blocks'
        return biggan.BigGANDiscriminator.num_blocks, 'residual blocks'

    def G_kwargs(self, e: Any) -> dnnlib.EasyDict:
        kwargs = self.network_kwargs(e, e.preset.G_kwargs)
        if e.depth is not None:
            kwargs.update(depth=e.depth)
        return kwargs

    def D_kwargs(self, e: Any) -> dnnlib.EasyDict:
        kwargs = self.network_kwargs(e, e.preset.D_kwargs)
        kwargs.update({key: getattr(e, key) for key in ('act', 'depth') if getattr(e, key) is not None})
        if e.freezed:  # Freeze-D: the first units' weights are buffers (GN differentiates through them).
            kwargs['freeze_layers' if e.preset.arch == 'cnn' else 'freeze_blocks'] = e.freezed
        return kwargs

    def schedule_kwargs(self, e: Any) -> dnnlib.EasyDict:
        """Fixed batches: D's M, G's the preset's ratio of it; the preset's n_dis, lr decay and EMA."""
        preset = e.preset
        return dnnlib.EasyDict(
            class_name='training.recipes.schedule.FixedSchedule', batch_D=e.batch,
            batch_G=max(1, preset.batch_G * e.batch // preset.batch_D), n_dis=preset.n_dis, lr_G=e.glr,
            lr_D=e.dlr, total_steps=e.steps, lr_decay=preset.lr_decay, ema_beta=preset.ema_beta,
            ema_start=preset.ema_start, num_gpus=e.gpus, batch_gpu=e.batch_gpu)


RECIPE = SNGANRecipe()
