"""Speed and memory of gn-stylegan2 training steps, by precision, with the custom CUDA ops and with their references.

    python -m bench.stylegan2                                  # 256x256 and 1024x1024, tf32/bf16/fp16, both op implementations
    python -m bench.stylegan2 --resolutions=1024 --precisions=fp16 --impl=cuda --steps=16 --out=bench-stylegan2.json

One measured iteration is what the training loop does per batch of gn-stylegan2 (bench/common.py: the loop's
TrainingStep on GANLoss): a D step with gradient normalization and the hinge loss (a double backward through D)
and a G step (the exact GN path, as D's minibatch stddev is not piecewise linear, with style mixing), each with its
Adam update; the lazy path length term joins every 4th G step, as in training, so `--steps` should be a multiple
of 4. The networks are the preset's full StyleGAN2 pair for --sg2-cfg at the resolution (NVIDIA's 'auto' by
default: channel_base 16384 below 512x512, 32768 from there), unconditional, with one GPU's share of that
configuration's batch on 8 GPUs (256x256: 8 of 64; 1024x1024: 4 of 32). Precision: tf32; bf16 (the blocks under
autocast); fp16 (NVIDIA's mixed precision: the top 4 resolutions in float16, clamped at 256). Reported: seconds per
thousand real images shown to D, seconds per iteration and peak GPU memory. Prints a table and writes JSON. Needs a
CUDA GPU (--device=cpu runs the same on a CPU, without peak memory, for a smoke test).
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import datetime
import time

import click

import torch

import dnnlib
from bench.common import (build_network, parse_list, preset_experiment, random_batch, step_switches, training_step,
                          write_json_atomic)
from bench.stylegan import kernels_loaded, op_implementation
from training.recipes import stylegan2 as recipe

PAPER_GPUS = 8  # NVIDIA's configurations split their batch over 8 GPUs.
PRECISIONS = ('fp32', 'tf32', 'bf16', 'fp16')

#----------------------------------------------------------------------------


def bench_one(resolution: int, precision: str, impl: str, steps: int, warmup: int, device: torch.device,
              sg2_cfg: str = 'auto', cmax: int | None = None) -> dict:
    """Time `steps` D+G iterations (lazy regularizers at their intervals) after `warmup` untimed ones."""
    opts = preset_experiment('gn-stylegan2', resolution=resolution, label_dim=0, sg2_cfg=sg2_cfg, gpus=PAPER_GPUS,
                             precision=precision, cmax=cmax, kimg=1, aug='noaug')  # The records' rows: D sees the images.
    batch = opts.batch // PAPER_GPUS
    G, D = build_network(opts.G_kwargs, device), build_network(opts.D_kwargs, device)
    G_opt = dnnlib.util.construct_class_by_name(params=G.parameters(), **opts.G_opt_kwargs)
    D_opt = dnnlib.util.construct_class_by_name(params=D.parameters(), **opts.D_opt_kwargs)
    training = training_step(G, D, G_opt, D_opt, opts.loss_kwargs, precision=precision,
                             group_size=opts.schedule_kwargs.group_size)
    real_img, labels = random_batch(G, batch, resolution, device)[:2]
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == 'cuda' else (lambda: None)

    def iteration(step: int) -> None:
        with step_switches(training):
            training.discriminator(real_img, labels, labels, rounds=1, step=step)
            training.generator(labels, rounds=1, step=step)

    with op_implementation(impl):
        for step in range(warmup):
            iteration(step)
        sync()
        if device.type == 'cuda':
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        for step in range(steps):
            iteration(step)
        sync()
        elapsed = time.perf_counter() - start
        kernels = impl == 'cuda' and device.type == 'cuda' and kernels_loaded()
    return dict(resolution=resolution, sg2_cfg=sg2_cfg, precision=precision, batch=batch, impl=impl,
                kernels_loaded=kernels, steps=steps, G_params=sum(p.numel() for p in G.parameters()),
                sec_per_step=elapsed / steps, sec_per_kimg=elapsed / (steps * batch) * 1000,
                peak_mem_gib=torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == 'cuda' else None)

#----------------------------------------------------------------------------


def parse_resolutions(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    try:
        resolutions = [int(r) for r in value.split(',')]
    except ValueError:
        raise click.BadParameter(f'expected a comma-separated list of resolutions, got "{value}"') from None
    bad = [r for r in resolutions if r < 4 or r & (r - 1)]
    if bad:
        raise click.BadParameter(f'resolutions must be powers of two of at least 4, got {bad}')
    return resolutions


@click.command()
@click.option('--resolutions', help='Resolutions to benchmark (comma-separated)', default='256,1024', show_default=True,
              callback=parse_resolutions)
@click.option('--precisions',  help='Precisions (comma-separated)', default='tf32,bf16,fp16', show_default=True,
              callback=parse_list(PRECISIONS))
@click.option('--impl',        help='Op implementations to compare', type=click.Choice(['both', 'cuda', 'ref']),
              default='both', show_default=True)
@click.option('--sg2-cfg',     help='NVIDIA\'s configuration (train.py --sg2-cfg)', type=click.Choice(list(recipe.SPECS)),
              default='auto', show_default=True)
@click.option('--cmax',        help='Cap on the feature maps  [default: 512]', metavar='INT', type=click.IntRange(min=1))
@click.option('--steps',       help='Timed iterations per configuration', type=click.IntRange(min=1), default=16, show_default=True)
@click.option('--warmup',      help='Untimed iterations first (kernel builds, cuDNN autotuning)', type=click.IntRange(min=0),
              default=4, show_default=True)
@click.option('--device',      help='cuda or cpu (a smoke test)', default='cuda', show_default=True)
@click.option('--out',         help='JSON file for the results', metavar='PATH', default='bench-stylegan2.json', show_default=True)
def main(resolutions: list[int], precisions: list[str], impl: str, sg2_cfg: str, cmax: int | None, steps: int, warmup: int,
         device: str, out: str) -> None:
    """Seconds per thousand images and peak GPU memory of gn-stylegan2 training steps."""
    device = torch.device(device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise click.ClickException('this benchmark needs a CUDA GPU, and PyTorch sees none (--device=cpu: a smoke test)')
    if device.type == 'cuda':
        torch.backends.cudnn.benchmark = True
    impls = ['cuda', 'ref'] if impl == 'both' else [impl]

    rows = []
    print(f'{"resolution":>10} {"precision":>9} {"batch":>5} {"ops":>5} {"sec/kimg":>9} {"sec/step":>9} {"peak GiB":>9}',
          flush=True)
    for resolution in resolutions:
        for precision in precisions:
            for name in impls:
                row = bench_one(resolution, precision, name, steps, warmup, device, sg2_cfg, cmax)
                rows.append(row)
                label = name if name == 'ref' or row['kernels_loaded'] else 'ref*'
                peak = '-' if row['peak_mem_gib'] is None else f'{row["peak_mem_gib"]:.2f}'
                print(f'{resolution:>10} {precision:>9} {row["batch"]:>5} {label:>5} {row["sec_per_kimg"]:>9.2f} '
                      f'{row["sec_per_step"]:>9.4f} {peak:>9}', flush=True)
                if device.type == 'cuda':
                    torch.cuda.empty_cache()
    if any(row['impl'] == 'cuda' and not row['kernels_loaded'] for row in rows):
        print('ref*: the CUDA kernels were not used (not built, or not a GPU), so "cuda" ran the reference ops too',
              flush=True)
    write_json_atomic(out, dict(
        benchmark='gn-stylegan2 training iteration (GN + hinge D step, exact GN G step with style mixing, lazy path '
                  'length every 4th, Adam)',
        device=torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu',
        torch=torch.__version__,
        cuda=torch.version.cuda,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
        results=rows))
    print(f'Wrote {out}')


if __name__ == '__main__':
    main()  # pylint: disable=no-value-for-parameter
