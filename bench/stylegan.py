"""Speed and memory of GN-StyleGAN training steps, with the custom CUDA ops and with their references.

    python -m bench.stylegan                                   # 128x128 and 1024x1024, both op implementations
    python -m bench.stylegan --resolutions=1024 --impl=cuda --steps=50 --out=bench-stylegan.json

One measured step is what the training loop does per minibatch of the gn-stylegan schedule, run
by the loop's own code (bench/common.py: NetworkUpdater.run on GANLoss): a discriminator step
with gradient normalization and the hinge loss (GN differentiates D's input gradient, so every D
layer runs a double backward) followed by a generator step (exact GN path: StyleGAN's D is not
piecewise linear), each with its Adam update. The networks are the full StyleGAN v1 pair of the
gn-stylegan preset built at --max-resolution and set to the lod at which the schedule trains the
benchmarked resolution, with one GPU's share of the paper's 8-GPU minibatch and its learning rate there. Reported: seconds per
thousand real images shown to D (the unit of the schedule and of training logs) and peak GPU
memory. Prints a table and writes the numbers to a JSON file. Needs a CUDA GPU.
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import contextlib
import datetime
import math
import time
from typing import Iterator
from unittest import mock

import click

import torch

import dnnlib
from bench.common import (build_network, preset_experiment, random_batch, step_switches, training_step,
                          write_json_atomic)
from ops import bias_act, conv2d_gradfix, upfirdn2d
from training.recipes import progressive

#----------------------------------------------------------------------------


@contextlib.contextmanager
def op_implementation(impl: str) -> Iterator[None]:
    """'cuda': the custom kernels (built on first use). 'ref': every op on its plain-PyTorch reference.

    The ops choose their kernel at call time, also inside conv2d_resample, which has no impl
    argument; so the reference run hides the kernels process-wide: the plugin loaders report
    "unavailable" (the ops' own fallback) and conv2d_gradfix defers to torch.nn.functional.
    """
    if impl == 'cuda':
        yield
        return
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(bias_act._plugin, 'get', lambda: None))  # pylint: disable=protected-access
        stack.enter_context(mock.patch.object(upfirdn2d._plugin, 'get', lambda: None))  # pylint: disable=protected-access
        stack.enter_context(mock.patch.object(conv2d_gradfix, 'enabled', False))
        yield


PAPER_GPUS = 8  # The paper trained GN-StyleGAN with StyleGAN v1's 8-GPU configuration.


def kernels_loaded() -> bool:
    return bias_act._plugin.get() is not None and upfirdn2d._plugin.get() is not None  # pylint: disable=protected-access


def bench_one(resolution: int, max_resolution: int, impl: str, steps: int, warmup: int, device: torch.device) -> dict:
    """Time `steps` D+G training steps at `resolution` after `warmup` untimed ones."""
    lod = math.log2(max_resolution) - math.log2(resolution)
    batch = progressive.BATCH[resolution] // PAPER_GPUS  # One GPU's share of the paper's 8-GPU run.
    opts = preset_experiment('gn-stylegan', resolution=max_resolution, batch=batch)
    G, D = build_network(opts.G_kwargs, device), build_network(opts.D_kwargs, device)
    for net in (G, D):
        net.set_lod(lod)
    G_opt = dnnlib.util.construct_class_by_name(params=G.parameters(), **dict(opts.G_opt_kwargs, lr=progressive.LR[resolution]))
    D_opt = dnnlib.util.construct_class_by_name(params=D.parameters(), **dict(opts.D_opt_kwargs, lr=progressive.LR[resolution]))
    training = training_step(G, D, G_opt, D_opt, opts.loss_kwargs, precision='fp32', group_size=opts.schedule_kwargs.group_size)
    real_img, labels = random_batch(G, batch, resolution, device)[:2]

    def step() -> None:
        with step_switches(training):
            training.discriminator(real_img, labels, labels, rounds=1, step=0)
            training.generator(labels, rounds=1, step=0)

    with op_implementation(impl):
        for _ in range(warmup):
            step()
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        kernels = impl == 'cuda' and kernels_loaded()
    return dict(resolution=resolution, lod=lod, batch=batch, impl=impl, kernels_loaded=kernels, steps=steps,
                sec_per_step=elapsed / steps, sec_per_kimg=elapsed / (steps * batch) * 1000,
                peak_mem_gib=torch.cuda.max_memory_allocated(device) / 2 ** 30)

#----------------------------------------------------------------------------


def parse_resolutions(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    try:
        resolutions = [int(r) for r in value.split(',')]
    except ValueError:
        raise click.BadParameter(f'expected a comma-separated list of resolutions, got "{value}"') from None
    unknown = [r for r in resolutions if r not in progressive.BATCH]
    if unknown:
        raise click.BadParameter(f'the schedule has no minibatch size for {unknown}; '
                                 f'choose from {sorted(progressive.BATCH)}')
    return resolutions


@click.command()
@click.option('--resolutions',    help='Resolutions to benchmark (comma-separated)', default='128,1024', show_default=True,
              callback=parse_resolutions)
@click.option('--max-resolution', help='Final resolution of the networks', type=click.Choice(['256', '512', '1024']),
              default='1024', show_default=True)
@click.option('--impl',           help='Op implementations to compare', type=click.Choice(['both', 'cuda', 'ref']), default='both',
              show_default=True)
@click.option('--steps',          help='Timed D+G steps per configuration', type=click.IntRange(min=1), default=20, show_default=True)
@click.option('--warmup',         help='Untimed steps first (kernel builds, cuDNN autotuning)', type=click.IntRange(min=0),
              default=5, show_default=True)
@click.option('--out',            help='JSON file for the results', metavar='PATH', default='bench-stylegan.json', show_default=True)
def main(resolutions: list[int], max_resolution: str, impl: str, steps: int, warmup: int, out: str) -> None:
    """Seconds per thousand images and peak GPU memory of GN-StyleGAN training steps."""
    if not torch.cuda.is_available():
        raise click.ClickException('this benchmark needs a CUDA GPU, and PyTorch sees none')
    max_res = int(max_resolution)
    if any(r > max_res for r in resolutions):
        raise click.ClickException(f'--resolutions must not exceed --max-resolution={max_res}')
    device = torch.device('cuda')
    torch.backends.cudnn.benchmark = True
    impls = ['cuda', 'ref'] if impl == 'both' else [impl]

    rows = []
    print(f'{"resolution":>10} {"batch":>5} {"ops":>5} {"sec/kimg":>9} {"sec/step":>9} {"peak GiB":>9}', flush=True)
    for resolution in resolutions:
        for name in impls:
            row = bench_one(resolution, max_res, name, steps, warmup, device)
            rows.append(row)
            label = name if name == 'ref' or row['kernels_loaded'] else 'ref*'
            print(f'{resolution:>10} {row["batch"]:>5} {label:>5} {row["sec_per_kimg"]:>9.2f} '
                  f'{row["sec_per_step"]:>9.4f} {row["peak_mem_gib"]:>9.2f}', flush=True)
            torch.cuda.empty_cache()
    if any(row['impl'] == 'cuda' and not row['kernels_loaded'] for row in rows):
        print('ref*: the CUDA kernels could not be built, so "cuda" ran the reference ops too', flush=True)

    write_json_atomic(out, dict(
        benchmark='gn-stylegan training step (GN + hinge D step, exact GN G step, Adam)',
        device=torch.cuda.get_device_name(device),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
        max_resolution=max_res,
        results=rows,
    ))
    print(f'Results written to {out}')


if __name__ == '__main__':
    main()  # pylint: disable=no-value-for-parameter
