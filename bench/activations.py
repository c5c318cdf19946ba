"""The GN-GAN paper's activation ablation (figures "Comparison of activation functions ... on STL-10 / CIFAR-10") at a
CPU size on the embedded digits: the standard CNN's discriminator with each activation, trained as GAN, WGAN-GP,
SN-GAN and GN-GAN.

\b
    python -m bench.activations --outdir=out/activations
    python -m bench.activations --outdir=out/activations --methods=sn,gn --acts=relu,softplus --steps=200

Each cell is train.py itself, `--cfg=quickstart --act=ACT` with the method's constraint and loss:

\b
    gan     --norm=none --loss=ns            wgan-gp  --norm=gp1 --loss=wasserstein
    sn      --norm=sn   --loss=ns            gn       --norm=gn  --loss=ns

(the non-saturating loss is that of the paper's standard-CNN presets, cifar10-cnn and stl10-cnn), for --steps G
steps, in DIR/runs/METHOD-ACT. Its last snapshot is scored with the digit classifier of bench/quickstart_quality.py
(the Frechet distance of its features, lower is better, the stand-in for FID; and the share of confidently
classified digits, the stand-in for IS) and with L_D (metrics/lipschitz.py, --ld-num real and generated images):
for GN with a smooth activation, whose speed-ups are off, L_D shows whether ||grad f_hat|| stays bounded by 1 without
the piecewise-linear theorem. Writes DIR/activations.json, then DIR/activations.png (FD and confident share per method,
one bar per activation; without matplotlib one line says so), and prints the table. The paper's own command is the
same with --cfg=cifar10-cnn or --cfg=stl10-cnn (docs/results.md).
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import os
import time

import click

import torch

from bench import depth_study, quickstart_quality
from bench.common import no_figure, pyplot, write_json_atomic
from training.networks import sngan

METHODS = {'gan': ('none', 'ns'), 'wgan-gp': ('gp1', 'wasserstein'), 'sn': ('sn', 'ns'), 'gn': ('gn', 'ns')}
METHOD_NAMES = {'gan': 'GAN', 'wgan-gp': 'WGAN-GP', 'sn': 'SN-GAN', 'gn': 'GN-GAN'}

#----------------------------------------------------------------------------


def draw(plt, cells: dict, methods: list[str], acts: list[str], path: str) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    width = 0.8 / len(acts)
    for ax, key, label in [(axes[0], 'confident', 'confidently classified digits (higher is better)'),
                           (axes[1], 'fd', 'FD of the classifier\'s features (lower is better)')]:
        for i, act in enumerate(acts):
            values = [cells[f'{method}-{act}'][key] for method in methods]
            ax.bar([m + (i - (len(acts) - 1) / 2) * width for m in range(len(methods))], values, width, label=act)
        ax.set_xticks(range(len(methods)))
        ax.set_xticklabels([METHOD_NAMES[method] for method in methods])
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def split_list(text: str, valid, what: str) -> list[str]:
    items = [item for item in text.split(',') if item]
    for item in items:
        try:
            valid(item)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint=what) from None
    return items


def check_method(name: str) -> None:
    if name not in METHODS:
        raise ValueError(f'unknown method "{name}"; valid: {", ".join(METHODS)}')


@click.command(help=__doc__)
@click.option('--outdir', required=True, type=click.Path(file_okay=False), help='Folder of the runs, the chart and the JSON.')
@click.option('--methods', default='gan,wgan-gp,sn,gn', show_default=True, help='Comma-separated: gan, wgan-gp, sn, gn.')
@click.option('--acts', default='relu,lrelu,elu,softplus,softplus:20', show_default=True,
              help='Comma-separated activations of D (train.py --act).')
@click.option('--steps', default=300, show_default=True, type=click.IntRange(min=1), help='G steps per run.')
@click.option('--num', default=500, show_default=True, type=click.IntRange(min=2), help='Generated images scored per run.')
@click.option('--ld-num', default=1000, show_default=True, type=click.IntRange(min=1), help='Real and generated images of L_D each.')
@click.option('--epochs', default=8, show_default=True, type=click.IntRange(min=1), help='Epochs of the digit classifier.')
def main(outdir: str, methods: str, acts: str, steps: int, num: int, ld_num: int, epochs: int) -> None:
    methods = split_list(methods, check_method, '--methods')
    acts = split_list(acts, sngan.parse_activation, '--acts')
    os.makedirs(outdir, exist_ok=True)
    log = lambda message: print(message, flush=True)
    start = time.time()
    judge = quickstart_quality.trained_judge(epochs, seed=0)
    log(f'digit classifier: held-out accuracy {judge["accuracy"]:.3f}')
    cells = {}
    for method in methods:
        norm, loss = METHODS[method]
        for act in acts:
            options = [f'--norm={norm}', f'--loss={loss}', f'--act={act}']
            run_dir = depth_study.train_run(os.path.join(outdir, 'runs', f'{method}-{act.replace(":", "")}'), options,
                                            steps, 1, log)
            point = depth_study.measure_snapshot(depth_study.snapshot_paths(run_dir)[-1], judge, num, ld_num)
            cells[f'{method}-{act}'] = dict(method=method, act=act, command=' '.join(['python train.py --cfg=quickstart'] + options),
                                            run_dir=run_dir, **point)
            log(f'{method} {act}: confident {point["confident"]:.1%}, FD {point["fd"]:.1f}, L_D {point["l_d"]:.3g}')
    write_json_atomic(os.path.join(outdir, 'activations.json'), dict(
        classifier_accuracy=judge['accuracy'], steps=steps, num=num, ld_num=ld_num, torch=torch.__version__,
        seconds=time.time() - start, cells=cells))
    plt = pyplot()
    if plt is not None:
        draw(plt, cells, methods, acts, os.path.join(outdir, 'activations.png'))
    log('')
    log('| method | ' + ' | '.join(acts) + ' |')
    log('|---|' + '---|' * len(acts))
    for method in methods:
        log(f'| {METHOD_NAMES[method]} | ' + ' | '.join(
            f'{cells[f"{method}-{act}"]["confident"]:.0%}, FD {cells[f"{method}-{act}"]["fd"]:.0f}, '
            f'L_D {cells[f"{method}-{act}"]["l_d"]:.2g}' for act in acts) + ' |')
    log(f'wrote {os.path.join(outdir, "activations.json")} ({time.time() - start:.0f} s); ' +
        ('and activations.png' if plt is not None else no_figure('activations.png')))


if __name__ == '__main__':
    main()  # pylint: disable=no-value-for-parameter
