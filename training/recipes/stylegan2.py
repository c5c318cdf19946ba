"""The StyleGAN2 family: gn-stylegan2, NVIDIA StyleGAN2-ADA's networks trained as NVIDIA's configurations train
them (--sg2-cfg: batch, learning rate, EMA, minibatch-stddev group, mapping depth), with GN and the hinge loss in place
of R1, path length regularization and style mixing, and NVIDIA's lazy regularization for the terms that allow it.
"""

from __future__ import annotations

from typing import Any

import dnnlib
from training.recipes.recipe import DataMismatch, Recipe
from training.step import CONSTRAINTS

#----------------------------------------------------------------------------

PRESETS = {
    # StyleGAN2 as NVIDIA's StyleGAN2-ADA trains it (--sg2-cfg picks its configuration: batch, lr, EMA, ...), GN + hinge for R1.
    'gn-stylegan2': dict(arch='stylegan2', z_dim=512, loss='hinge', lr_G=0.0025, lr_D=0.0025, betas=[0.0, 0.99], n_dis=1,
                         lr_decay='none', conditional='if-labels', xflip=False, aug='ada',
                         description='StyleGAN2 (NVIDIA StyleGAN2-ADA\'s networks and configurations, --sg2-cfg), '
                                     'hinge loss, GN instead of R1, path length regularization and style mixing; '
                                     'class-conditional when the data has labels'),
}

SN_D = 'training.networks.stylegan2.SNDiscriminator'  # D with --norm=sn: NVIDIA's Discriminator keeps its constructor.

# gn-stylegan2's sub-configurations (--sg2-cfg): NVIDIA StyleGAN2-ADA's train.py --cfg table. kimg: length; mb: global
# batch; mbstd: minibatch stddev group; fmaps: channel_base / 32768; lrate: Adam lr of G and D; gamma: R1 weight
# (--norm=r1); ema: G EMA half-life in kimg; ramp: EMA ramp-up (None: none); map: mapping layers; ref_gpus: GPUs the
# batch was split over (theirs per-GPU batch; here only the split of 'auto'). 'auto' is filled in by resolution and
# GPU count (sg2_config). 'cifar' also turns off path length regularization and style mixing, and D is 'orig'.
SPECS = {
    'auto':      dict(ref_gpus=-1, kimg=25000,  mb=-1, mbstd=-1, fmaps=-1,  lrate=-1,     gamma=-1,   ema=-1,  ramp=0.05, map=2),
    'stylegan2': dict(ref_gpus=8,  kimg=25000,  mb=32, mbstd=4,  fmaps=1,   lrate=0.002,  gamma=10,   ema=10,  ramp=None, map=8),
    'paper256':  dict(ref_gpus=8,  kimg=25000,  mb=64, mbstd=8,  fmaps=0.5, lrate=0.0025, gamma=1,    ema=20,  ramp=None, map=8),
    'paper512':  dict(ref_gpus=8,  kimg=25000,  mb=64, mbstd=8,  fmaps=1,   lrate=0.0025, gamma=0.5,  ema=20,  ramp=None, map=8),
    'paper1024': dict(ref_gpus=8,  kimg=25000,  mb=32, mbstd=4,  fmaps=1,   lrate=0.002,  gamma=2,    ema=10,  ramp=None, map=8),
    'cifar':     dict(ref_gpus=2,  kimg=100000, mb=64, mbstd=32, fmaps=1,   lrate=0.0025, gamma=0.01, ema=500, ramp=0.05, map=2),
}
LOSS = dict(style_mixing_prob=0.9, pl_weight=2.0, pl_decay=0.01, pl_batch_shrink=2)  # NVIDIA's StyleGAN2Loss.
REG_INTERVALS = dict(G=4, D=16)  # NVIDIA's lazy regularization: path length every 4th G step, R1 every 16th D step.


def sg2_config(name: str, resolution: int, gpus: int) -> dnnlib.EasyDict:
    """The --sg2-cfg entry `name` for images of `resolution` trained on `gpus` GPUs ('auto' as NVIDIA's train.py)."""
    dnnlib.util.check_choice('sg2_cfg', name, tuple(SPECS))
    config = dnnlib.EasyDict(SPECS[name])
    if name == 'auto':
        config.ref_gpus = gpus
        config.mb = max(min(gpus * min(4096 // resolution, 32), 64), gpus)
        config.mbstd = min(config.mb // gpus, 4)
        config.fmaps = 1 if resolution >= 512 else 0.5
        config.lrate = 0.002 if resolution >= 1024 else 0.0025
        config.gamma = 0.0002 * resolution ** 2 / config.mb
        config.ema = config.mb * 10 / 32
    return config


def d_layers(resolution: int, architecture: str) -> int:
    """The layers of NVIDIA's D that --freezed counts (its blocks', from the input): per block above 4x4 two 3x3 convs,
    and a 1x1 skip ('resnet') or fromRGB ('skip'); the first block's fromRGB."""
    blocks = resolution.bit_length() - 3
    return blocks * (2 + (architecture in ('resnet', 'skip'))) + (architecture != 'skip')


class StyleGAN2Recipe(Recipe):
    """NVIDIA's StyleGAN2 with one of its configurations (--sg2-cfg), filled in for the data's resolution and --gpus."""

    presets = PRESETS
    archs = {'stylegan2': ('training.networks.stylegan2.Generator', 'training.networks.stylegan2.Discriminator')}
    options = ('cmax', 'd_cmax', 'map_dim', 'style_mixing', 'sg2_cfg', 'pl_weight')
    owner = 'gn-stylegan2'
    datasets = {'gn-stylegan2': 'images of a power-of-two size such as FFHQ, MetFaces or AFHQ (python dataset_tool.py '
                                '--source=DIR --dest=data.zip)'}

    def constrain_D(self, D_kwargs: dnnlib.EasyDict, norm: str) -> None:
        if CONSTRAINTS[norm].spectral_norm:
            D_kwargs.class_name = SN_D

    def fill(self, values: dict[str, Any], given: dict[str, Any], preset: dnnlib.EasyDict) -> None:
        """The defaults of NVIDIA's configuration --sg2-cfg (for the data's resolution and --gpus), then the length."""
        name = values.setdefault('sg2_cfg', 'auto')
        img_resolution = values['img_resolution']
        if img_resolution < 4 or img_resolution & (img_resolution - 1):
            raise DataMismatch(f'StyleGAN2 needs power-of-two images of at least 4x4, the dataset has '
                             f'{img_resolution}x{img_resolution}')
        config = sg2_config(name, img_resolution, values['gpus'])
        values.setdefault('glr', config.lrate)
        values.setdefault('dlr', config.lrate)
        values.setdefault('batch', config.mb)
        values.setdefault('gamma', float(config.gamma))
        values.setdefault('cmax', 512)
        values.setdefault('d_cmax', values['cmax'])
        values.setdefault('map_dim', 512)
        values.setdefault('style_mixing', 0.0 if name == 'cifar' else LOSS['style_mixing_prob'])
        values.setdefault('pl_weight', 0.0 if name == 'cifar' else LOSS['pl_weight'])
        if 'steps' not in values:
            values.setdefault('kimg', float(config.kimg))
        self.fill_fixed(values, preset)

    def freezable(self, values: dict[str, Any]) -> tuple[int, str]:
        """NVIDIA's layers (d_layers) of the filled-in configuration."""
        return d_layers(values['img_resolution'], 'orig' if values['sg2_cfg'] == 'cifar' else 'resnet'), 'layers'

    @staticmethod
    def config_of(e: Any) -> dnnlib.EasyDict:
        """The experiment's --sg2-cfg entry."""
        return sg2_config(e.sg2_cfg, e.img_resolution, e.gpus)

    def _precision(self, e: Any) -> dict:
        """NVIDIA's mixed precision: float16 in the top 4 resolutions with --precision=fp16, and the convolution outputs
        clamped at 256 (their configurations always clamp)."""
        return dict(channel_base=int(self.config_of(e).fmaps * 32768), num_fp16_res=4 if e.precision == 'fp16' else 0,
                    conv_clamp=256)

    def G_kwargs(self, e: Any) -> dnnlib.EasyDict:
        kwargs = self.network_kwargs(e, e.preset.G_kwargs)
        kwargs.update(z_dim=e.map_dim, w_dim=e.map_dim, mapping_kwargs=dict(num_layers=self.config_of(e).map),
                      synthesis_kwargs=dict(channel_max=e.cmax, **self._precision(e)))
        return kwargs

    def D_kwargs(self, e: Any) -> dnnlib.EasyDict:
        kwargs = self.network_kwargs(e, e.preset.D_kwargs)
        kwargs.update(channel_max=e.d_cmax, epilogue_kwargs=dict(mbstd_group_size=self.config_of(e).mbstd), **self._precision(e))
        if e.sg2_cfg == 'cifar':
            kwargs.update(architecture='orig')
        if e.freezed:  # NVIDIA's Freeze-D: the first layers' weights are buffers (GN differentiates through them).
            kwargs.update(block_kwargs=dict(freeze_layers=e.freezed))
        return kwargs

    @staticmethod
    def reg_interval(e: Any, net: str) -> int:
        """Every how many steps `net`'s regularizer runs: NVIDIA's interval where it is lazy (G's path length term, D's
        R1), else 1 (every step, or no regularizer)."""
        lazy = e.pl_weight if net == 'G' else CONSTRAINTS[e.norm].lazy
        return REG_INTERVALS[net] if lazy else 1

    def opt_kwargs(self, e: Any, net: str) -> dnnlib.EasyDict:
        """NVIDIA's Adam adjustment for a term regularized lazily every k steps: lr * k / (k + 1), betas ** (k / (k + 1))."""
        k = self.reg_interval(e, net)
        ratio = k / (k + 1) if k > 1 else 1.0
        base = super().opt_kwargs(e, net)
        return dnnlib.EasyDict(base, lr=base.lr * ratio, betas=[b ** ratio for b in base.betas])

    def loss_kwargs(self, e: Any) -> dnnlib.EasyDict:
        """NVIDIA's StyleGAN2 loss terms and lazy regularization intervals."""
        kwargs = super().loss_kwargs(e)
        kwargs.update(style_mixing_prob=e.style_mixing, pl_weight=e.pl_weight, pl_decay=LOSS['pl_decay'],
                      pl_batch_shrink=LOSS['pl_batch_shrink'], G_reg_interval=self.reg_interval(e, 'G'),
                      D_reg_interval=self.reg_interval(e, 'D'))
        return kwargs

    def schedule_kwargs(self, e: Any) -> dnnlib.EasyDict:
        """NVIDIA's: one batch for D and G, EMA by half-life with its ramp-up; the lazy regularization intervals, so
        that the schedule says why its learning rates are not --glr and --dlr."""
        config = self.config_of(e)
        return dnnlib.EasyDict(
            class_name='training.recipes.schedule.FixedSchedule', batch_D=e.batch, batch_G=e.batch, n_dis=1,
            lr_G=e.G_opt_kwargs.lr, lr_D=e.D_opt_kwargs.lr, total_steps=e.steps, lr_decay='none', ema_kimg=config.ema,
            ema_rampup=config.ramp, num_gpus=e.gpus, batch_gpu=e.batch_gpu, group_size=config.mbstd,
            reg_interval_G=self.reg_interval(e, 'G'), reg_interval_D=self.reg_interval(e, 'D'))


RECIPE = StyleGAN2Recipe()
