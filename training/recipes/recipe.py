"""What a family of --cfg presets knows: its presets table, the options only it takes, and how an experiment's
values become the kwargs of its networks, optimizers, loss and schedule.

    Experiment.build(options)  --recipe.fill-->  every value of the family filled in and checked (once)
    Experiment                 --recipe.G_kwargs, D_kwargs, opt_kwargs, loss_kwargs, schedule_kwargs-->  the loop

`Recipe` holds what every family shares: a preset's classes and base kwargs (`config`), the data facts every
network takes (img_resolution, img_channels, c_dim) and a fixed-length run's defaults (`fill_fixed`). A family
module (sngan.py, stylegan.py, stylegan2.py) subclasses it with its own presets and rules; configs.py lists the
families. The Experiment (training/experiment.py) reads nothing of a family but through these methods.
"""

from __future__ import annotations

import abc
import copy
from typing import Any

import dnnlib
from training.step import CONSTRAINTS

#----------------------------------------------------------------------------


class DataMismatch(ValueError):
    """The data cannot be what a preset trains on (its size, its labels); the message is one line."""


class Recipe(abc.ABC):
    """A family of presets. Subclasses set the class attributes and override what their family does otherwise."""

    presets: dict[str, dict] = {}      # Preset name -> its settings (the keys that configs.py's docstring lists).
    archs: dict[str, tuple[str, str]] = {}  # Preset 'arch' -> (G class name, D class name).
    options: tuple[str, ...] = ()      # Experiment fields that only this family's presets take (None for the others).
    owner: str = ''                    # How a refusal names the presets that take `options`: '--tanh: gn-stylegan only'.
    sources: dict[tuple[str, ...], dict[str, str]] = {}  # Where each preset value comes from (docs/configs.md).
    datasets: dict[str, str] = {}      # Preset name -> the data it was made for and how to build it (said when --data is not given).

    def takes(self, name: str) -> tuple[str, ...]:
        """The family options that preset `name` takes (all of them, unless the family says otherwise)."""
        return self.options

    #------------------------------------------------------------------------
    # The preset as the training loop's base kwargs.

    def config(self, name: str, norm: str, loss: str, cr: float) -> dnnlib.EasyDict:
        """Preset `name` with the constraint `norm`, the loss `loss` and the CR weight `cr` (checked by the
        Experiment): its classes and kwargs before the data and the command line's options fill them in."""
        preset = copy.deepcopy(self.presets[name])
        G_class, D_class = self.archs[preset['arch']]
        cfg = dnnlib.EasyDict(name=name, description=preset['description'], arch=preset['arch'])
        cfg.G_kwargs = dnnlib.EasyDict(class_name=G_class, z_dim=preset['z_dim'], **preset.get('G_args', {}))
        cfg.D_kwargs = dnnlib.EasyDict(class_name=D_class, **preset.get('D_args', {}))
        self.constrain_D(cfg.D_kwargs, norm)
        cfg.loss_kwargs = dnnlib.EasyDict(class_name='training.step.loss.GANLoss', loss=loss, norm=norm, cr=cr)
        cfg.G_opt_kwargs = dnnlib.EasyDict(class_name='torch.optim.Adam', lr=preset['lr_G'], betas=preset['betas'], eps=1e-8)
        cfg.D_opt_kwargs = dnnlib.EasyDict(class_name='torch.optim.Adam', lr=preset['lr_D'], betas=preset['betas'], eps=1e-8)
        for key in ['n_dis', 'batch_D', 'batch_G', 'total_steps', 'lr_decay', 'ema_beta', 'ema_start', 'z_dim',
                    'conditional', 'resolution', 'aug']:
            if key in preset:  # A family whose schedule sets batches, length, EMA and resolution by itself leaves them out.
                cfg[key] = preset[key]
        cfg.xflip = preset.get('xflip', True)  # Random horizontal flips of the reals (the paper's, for every dataset).
        return cfg

    def constrain_D(self, D_kwargs: dnnlib.EasyDict, norm: str) -> None:
        """D's kwargs for the constraint `norm`: spectral normalization through D's `spectral_norm` kwarg."""
        D_kwargs.spectral_norm = CONSTRAINTS[norm].spectral_norm

    #------------------------------------------------------------------------
    # Filling in and checking an experiment's values (Experiment.build, once).

    def fill(self, values: dict[str, Any], given: dict[str, Any], preset: dnnlib.EasyDict) -> None:
        """Fill in `values` (the Experiment's fields so far; `given`: those the caller gave) with the family's
        defaults for `preset`, raising ValueError in one line on a value the family cannot train."""
        self.fill_fixed(values, preset)

    def freezable(self, values: dict[str, Any]) -> tuple[int, str]:
        """Freeze-D (--freezed, checked once the family has filled `values` in): how many of D's units, counted from
        the input, can be frozen, and what they are ('layers', 'residual blocks'); ValueError in one line for a D
        without any."""
        raise ValueError(f'--freezed: the D of --cfg={values["cfg"]} has no layers to freeze')

    @staticmethod
    def fill_fixed(values: dict[str, Any], preset: dnnlib.EasyDict) -> None:
        """A run of fixed batches at the data's resolution: the preset's learning rates, batch and length, a --kimg
        turned into G steps."""
        name, img_resolution = values['cfg'], values['img_resolution']
        if preset.get('resolution', img_resolution) != img_resolution:  # No resolution: any.
            raise DataMismatch(f'--cfg={name} is built for {preset.resolution}x{preset.resolution} images, '
                               f'but the dataset holds {img_resolution}x{img_resolution}')
        values['resolution'] = img_resolution
        values.setdefault('glr', preset.G_opt_kwargs.lr)
        values.setdefault('dlr', preset.D_opt_kwargs.lr)
        values.setdefault('batch', preset.get('batch_D'))
        if 'kimg' in values:  # The length in G steps: kimg of reals at n_dis D steps of M each.
            values['steps'] = max(1, round(values.pop('kimg') * 1000 / (preset.n_dis * values['batch'])))
        values.setdefault('steps', preset.get('total_steps'))

    def old_record(self, record: dict[str, Any], snapshot: dict[str, Any]) -> None:
        """Fill in, from the networks of `snapshot`, the family options that a record written before they were
        options lacks (training/experiment.py's from_snapshot); nothing for a family that had none then."""

    #------------------------------------------------------------------------
    # What the training loop builds.

    @staticmethod
    def network_kwargs(e: Any, base: dict) -> dnnlib.EasyDict:
        """`base` (a preset's G_kwargs or D_kwargs) with the data facts every network takes."""
        return dnnlib.EasyDict(base, img_resolution=e.resolution, img_channels=e.img_channels,
                               c_dim=e.label_dim if e.conditional else 0)

    def G_kwargs(self, e: Any) -> dnnlib.EasyDict:
        return self.network_kwargs(e, e.preset.G_kwargs)

    def D_kwargs(self, e: Any) -> dnnlib.EasyDict:
        return self.network_kwargs(e, e.preset.D_kwargs)

    def opt_kwargs(self, e: Any, net: str) -> dnnlib.EasyDict:
        """The Adam kwargs of `net` ('G' or 'D'): the preset's, at the experiment's learning rate."""
        base = e.preset[f'{net}_opt_kwargs']
        lr = e.glr if net == 'G' else e.dlr
        return dnnlib.EasyDict(base, lr=lr if lr is not None else base.lr)

    def loss_kwargs(self, e: Any) -> dnnlib.EasyDict:
        return dnnlib.EasyDict(e.preset.loss_kwargs, r1_gamma=e.gamma)

    @abc.abstractmethod
    def schedule_kwargs(self, e: Any) -> dnnlib.EasyDict:
        """The class name and kwargs of the run's schedule (training/recipes/schedule.py)."""
