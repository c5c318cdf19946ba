"""The StyleGAN v1 family: gn-stylegan, StyleGAN v1 with progressive growing from 8x8 to the final resolution, trained
with GN and the hinge loss in place of R1 (the paper's appendix "Experiments on Progressive Growing Architecture"),
on StyleGAN v1's schedule (training/recipes/progressive.py).
"""

from __future__ import annotations

from typing import Any

import dnnlib
from training.recipes import progressive
from training.recipes.recipe import DataMismatch, Recipe

#----------------------------------------------------------------------------

PRESETS = {
    # Batch, lr and resolution follow training/recipes/progressive.py.
    'gn-stylegan': dict(arch='stylegan', z_dim=512, loss='hinge', lr_G=progressive.LR[8], lr_D=progressive.LR[8],
                        betas=[0.0, 0.99], n_dis=1, lr_decay='none', conditional=False, D_args=dict(mbstd_group_size=4),
                        description='StyleGAN v1, progressive growing 8x8 -> full resolution, hinge loss, '
                                    'GN instead of R1, 25M images'),
}

SOURCES = {
    ('gn-stylegan',): {
        'networks': 'paper, appendix "Experiments on Progressive Growing Architecture": StyleGAN with GN in place of R1',
        'loss': 'paper, same appendix (hinge)',
        'lr G / D': 'paper, same appendix (1e-3 up to 64x64, 1.5e-3 above)',
        'n_dis': 'StyleGAN v1 (the paper: "the same parameters as StyleGAN")', 'Adam betas': 'StyleGAN v1 (0, 0.99)',
        'batch D / G': 'StyleGAN v1\'s 8-GPU minibatch schedule', 'length': 'StyleGAN v1 (25M images)',
        'lr decay': 'StyleGAN v1 (none)', 'G EMA': 'StyleGAN v1 (half-life 10k images)', 'x-flips': 'StyleGAN v1\'s CelebA-HQ run',
    },
}

# StyleGAN v1's network defaults (training/networks/stylegan.py).
DEFAULTS = dict(cmax=512, tanh=False, map_dim=512, map_lrmul=0.01, style_mixing=0.9)


class StyleGANRecipe(Recipe):
    """StyleGAN v1 with progressive growing: the length in kimg, batches and learning rates by resolution."""

    presets = PRESETS
    archs = {'stylegan': ('training.networks.stylegan.Generator', 'training.networks.stylegan.Discriminator')}
    options = ('cmax', 'd_cmax', 'tanh', 'map_dim', 'map_lrmul', 'style_mixing', 'lod_kimg', 'lr_rampdown', 'resolution')
    owner = 'gn-stylegan'
    sources = SOURCES
    datasets = {'gn-stylegan': 'CelebA-HQ at 1024x1024 (python dataset_tool.py --source=~/celeba-hq/images1024x1024 '
                               '--dest=celebahq-1024.zip)'}

    def fill(self, values: dict[str, Any], given: dict[str, Any], preset: dnnlib.EasyDict) -> None:
        img_resolution = values['img_resolution']
        if 'steps' in given:
            raise ValueError(f'--cfg={values["cfg"]} counts its length in --kimg, not --steps')
        if img_resolution & (img_resolution - 1):
            raise DataMismatch(f'progressive growing needs power-of-two images, the dataset has '
                             f'{img_resolution}x{img_resolution}')
        final = values.setdefault('resolution', img_resolution)
        if final < progressive.START_RESOLUTION or final & (final - 1):
            raise ValueError(f'progressive growing needs a power-of-two final resolution of at least '
                             f'{progressive.START_RESOLUTION}, got {final}')
        if final > img_resolution:
            raise DataMismatch(f'--resolution={final} exceeds the dataset resolution {img_resolution}')
        for key, default in DEFAULTS.items():
            values.setdefault(key, default)
        values.setdefault('d_cmax', values['cmax'])
        values.setdefault('kimg', progressive.TOTAL_KIMG)
        values.setdefault('lod_kimg', progressive.PHASE_KIMG)
        values.setdefault('lr_rampdown', 0.0)

    def freezable(self, values: dict[str, Any]) -> tuple[int, str]:
        """Refused: Freeze-D fine-tunes a D whose input layers have trained, and progressive growing fades them in."""
        raise ValueError('--freezed: gn-stylegan grows D at its input during the run, so a frozen first block would '
                         'never train; Freeze-D takes a D built at its full size (gn-stylegan2, the SN-GAN, ResNet '
                         'and BigGAN presets)')

    def old_record(self, record: dict[str, Any], snapshot: dict[str, Any]) -> None:
        G, D = snapshot['G'].init_kwargs, snapshot['D'].init_kwargs
        record.update(img_resolution=(snapshot.get('training_set_kwargs') or {}).get('resolution', G['img_resolution']),
                      cmax=G.get('fmap_max'), d_cmax=D.get('fmap_max'), tanh=G.get('output_tanh'),
                      style_mixing=G.get('style_mixing_prob'), map_lrmul=(G.get('mapping_kwargs') or {}).get('lr_multiplier'))

    def G_kwargs(self, e: Any) -> dnnlib.EasyDict:
        kwargs = self.network_kwargs(e, e.preset.G_kwargs)
        kwargs.update(fmap_max=e.cmax)
        kwargs.update(z_dim=e.map_dim, w_dim=e.map_dim, output_tanh=e.tanh, style_mixing_prob=e.style_mixing,
                      mapping_kwargs=dict(layer_features=e.map_dim, lr_multiplier=e.map_lrmul))
        return kwargs

    def D_kwargs(self, e: Any) -> dnnlib.EasyDict:
        kwargs = self.network_kwargs(e, e.preset.D_kwargs)
        kwargs.update(fmap_max=e.d_cmax)
        return kwargs

    def schedule_kwargs(self, e: Any) -> dnnlib.EasyDict:
        """StyleGAN v1's schedule: --glr / --dlr, when given, at every resolution; else v1's per resolution."""
        lr = lambda value: None if value is None else {r: value for r in progressive.LR}
        return dnnlib.EasyDict(
            class_name='training.recipes.schedule.ProgressiveSchedule', max_resolution=e.resolution, total_kimg=e.kimg,
            phase_kimg=e.lod_kimg, fade_kimg=e.lod_kimg, lr_G=lr(e.glr), lr_D=lr(e.dlr), max_batch=e.batch,
            lr_rampdown_kimg=e.lr_rampdown, num_gpus=e.gpus, batch_gpu=e.batch_gpu,
            group_size=e.preset.D_kwargs.mbstd_group_size)


RECIPE = StyleGANRecipe()
