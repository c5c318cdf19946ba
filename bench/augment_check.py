"""training/step/augment.py against the code it follows: NVIDIA's AugmentPipe and the DiffAugment authors' function.

    python -m bench.augment_check --nvidia-code=DIR --diffaug-code=DIR --out=bench-augment.json

--nvidia-code is a checkout of NVlabs/stylegan2-ada-pytorch (its training/augment.py; imported from there with
its own torch_utils, as bench/nvidia.py imports its networks); --diffaug-code is a checkout of
mit-han-lab/data-efficient-gans (its DiffAugment_pytorch.py). Neither is part of this project or its tests.

For every named pipeline of NVIDIA's train.py (AUGPIPE_SPECS), each p of --p, each seed and each image shape
(RGB square, RGB non-square, L), both pipelines get the same images and the same torch random state; printed per
pipeline and p: the largest difference over the seeds and shapes, the largest magnitude of theirs, and whether
both left the random state the same (the same number of draws). DiffAugment likewise for each policy alone and
for all three. Everything runs in float32 on the CPU (their custom ops take their reference paths there).
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import importlib
import importlib.util
import os
from types import ModuleType
from typing import Callable

import click
import torch

import dnnlib
from bench.common import write_json_atomic
from bench.nvidia import NvidiaCode
from training.step.augment import AUGPIPE_SPECS, AugmentPipe, DiffAugment

SHAPES = [(8, 3, 32, 32), (8, 3, 48, 32), (8, 1, 32, 32)]  # [N, C, H, W]: RGB square, RGB non-square, L
DIFFAUG_POLICIES = ['color', 'translation', 'cutout', 'color,translation,cutout']

#----------------------------------------------------------------------------


def import_nvidia_augment(path: str) -> tuple[NvidiaCode, ModuleType]:
    code = NvidiaCode(path)
    if not os.path.isfile(os.path.join(code.path, 'training', 'augment.py')):
        raise click.ClickException(f'--nvidia-code: {path} has no training/augment.py')
    with code.active():
        return code, importlib.import_module('training.augment')


def import_diffaugment(path: str) -> ModuleType:
    file = os.path.join(path, 'DiffAugment_pytorch.py')
    if not os.path.isfile(file):
        raise click.ClickException(f'--diffaug-code: {path} is not a checkout of mit-han-lab/data-efficient-gans '
                                   f'(no DiffAugment_pytorch.py)')
    spec = importlib.util.spec_from_file_location('diffaugment_authors', file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compare(theirs: Callable, ours: Callable, shape: tuple[int, ...], seed: int) -> dict:
    """Both functions on the same images from the same random state: the largest difference, the largest magnitude
    of theirs, and whether the random state after them is the same."""
    images = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1
    outputs, states = [], []
    for fn in (theirs, ours):
        torch.manual_seed(seed + 1)
        outputs.append(fn(images.clone()))
        states.append(torch.get_rng_state())
    return dict(max_abs_diff=float((outputs[0] - outputs[1]).abs().max()), max_abs=float(outputs[0].abs().max()),
                same_draws=bool(torch.equal(states[0], states[1])))


def merge(rows: list[dict]) -> dict:
    return dict(max_abs_diff=max(r['max_abs_diff'] for r in rows), max_abs=max(r['max_abs'] for r in rows),
                same_draws=all(r['same_draws'] for r in rows))


@click.command()
@click.option('--nvidia-code',  help='Checkout of NVlabs/stylegan2-ada-pytorch', metavar='DIR', required=True,
              type=str, callback=dnnlib.util.expand_user)
@click.option('--diffaug-code', help='Checkout of mit-han-lab/data-efficient-gans', metavar='DIR', required=True,
              type=str, callback=dnnlib.util.expand_user)
@click.option('--p',            help='Augmentation probabilities', metavar='LIST', default='0,0.5,1', show_default=True)
@click.option('--seeds',        help='Number of seeds per shape', type=click.IntRange(min=1), default=3,
              show_default=True)
@click.option('--out',          help='JSON file for the results', metavar='PATH', default='bench-augment.json',
              show_default=True)
def main(nvidia_code: str, diffaug_code: str, p: str, seeds: int, out: str) -> None:
    """Largest differences between our augmentations and NVIDIA's / the DiffAugment authors' from the same draws."""
    try:
        probabilities = [float(v) for v in p.split(',')]
    except ValueError:
        raise click.ClickException(f'--p: expected a comma-separated list of numbers, got "{p}"') from None
    code, nvidia = import_nvidia_augment(nvidia_code)
    authors = import_diffaugment(diffaug_code)
    torch.set_grad_enabled(False)
    rows = []
    print(f'{"augmentation":<26} {"p":>4} {"max |diff|":>11} {"max |theirs|":>12} {"same draws":>10}')
    for name, spec in AUGPIPE_SPECS.items():
        with code.active():
            their_pipe = nvidia.AugmentPipe(**spec)
        our_pipe = AugmentPipe(**spec)
        for prob in probabilities:
            their_pipe.p.fill_(prob)
            our_pipe.p.fill_(prob)
            row = merge([compare(their_pipe, our_pipe, shape, seed) for shape in SHAPES for seed in range(seeds)])
            rows.append(dict(kind='AugmentPipe', augmentation=name, p=prob, **row))
            print(f'{name:<26} {prob:>4g} {row["max_abs_diff"]:>11.3g} {row["max_abs"]:>12.3g} '
                  f'{str(row["same_draws"]):>10}')
    for policy in DIFFAUG_POLICIES:
        row = merge([compare(lambda x: authors.DiffAugment(x, policy=policy, channels_first=True),
                             lambda x: DiffAugment(x, policy), shape, seed)
                     for shape in SHAPES for seed in range(seeds)])
        rows.append(dict(kind='DiffAugment', augmentation=policy, p=None, **row))
        print(f'{policy:<26} {"":>4} {row["max_abs_diff"]:>11.3g} {row["max_abs"]:>12.3g} '
              f'{str(row["same_draws"]):>10}')
    write_json_atomic(out, dict(nvidia_code=code.path, diffaug_code=os.path.abspath(diffaug_code), device='cpu',
                                torch=torch.__version__, shapes=SHAPES, seeds=seeds, rows=rows))
    print(f'Wrote {out}')


if __name__ == '__main__':
    main()  # pylint: disable=no-value-for-parameter
