"""The --cfg presets of every family, as data, and the family that turns each into a run.

The families (training/recipes/recipe.py) hold their presets and rules: sngan.py (SN-GAN's CNN and ResNet,
BigGAN, the quick start), stylegan.py (StyleGAN v1 with progressive growing), stylegan2.py (NVIDIA's StyleGAN2).

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

`Experiment.build` completes a preset for a dataset and the command line's overrides through its family's
recipe (`recipe_for`); the training loop builds the networks, optimizers, loss and schedule from the Experiment.
Every preset takes the --norm, --loss and --cr overrides; --norm=sn turns on D's spectral normalization.
"""

from __future__ import annotations

from typing import Any

import dnnlib
from training.recipes import sngan, stylegan, stylegan2
from training.recipes.recipe import Recipe

#----------------------------------------------------------------------------

FAMILIES = (sngan.RECIPE, stylegan.RECIPE, stylegan2.RECIPE)
PRESETS = {name: preset for family in FAMILIES for name, preset in family.presets.items()}
SOURCES = {names: sources for family in FAMILIES for names, sources in family.sources.items()}  # docs/configs.md
FAMILY_OPTIONS = tuple(dict.fromkeys(option for family in FAMILIES for option in family.options))


def recipe_for(name: str) -> Recipe:
    """The family of preset `name`."""
    for family in FAMILIES:
        if name in family.presets:
            return family
    raise ValueError(f'unknown config "{name}"; valid: {", ".join(PRESETS)}')


def get_config(name: str, norm: str = 'gn', loss: str | None = None, cr: float = 0.0) -> dnnlib.EasyDict:
    """The preset `name` with the constraint `norm`, the loss `loss` (None: the preset's) and the CR weight `cr`."""
    recipe = recipe_for(name)
    return recipe.config(name, norm, recipe.presets[name]['loss'] if loss is None else loss, float(cr))


def check_options(name: str, given: dict[str, Any], img_resolution: int) -> None:
    """Refuse, in one line, the family options in `given` that preset `name` does not take, naming who takes each:
    '--cmax: gn-stylegan or gn-stylegan2 only; --tanh, --lr-rampdown: gn-stylegan only'. A --resolution equal to the
    data's is every preset's."""
    takes = recipe_for(name).takes(name)
    misplaced = [key for key in FAMILY_OPTIONS if key in given and key not in takes
                 and not (key == 'resolution' and given[key] == img_resolution)]
    owners: dict[str, list[str]] = {}
    for key in misplaced:
        where = ' or '.join(family.owner for family in FAMILIES if key in family.options)
        owners.setdefault(where, []).append(f'--{key.replace("_", "-")}')
    if owners:
        raise ValueError('; '.join(f'{", ".join(keys)}: {where} only' for where, keys in owners.items()))
