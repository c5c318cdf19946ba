"""The GN-GAN paper's depth study (its experimental analysis of Theorem 5, on layer-wise constraints, and its three-panel
figure) at a CPU size on the embedded digits: standard CNNs with n convolutional layers in G and D, SN against GN,
Wasserstein loss.

\b
    python -m bench.depth_study --outdir=out/depth-study                           # depths 3,5,7,9 x {sn, gn}
    python -m bench.depth_study --outdir=out/depth-study --depths=3,9 --steps=200 --snapshots=4

Each run is train.py itself (`--cfg=quickstart --loss=wasserstein --norm=NORM --depth=N`, --steps G steps,
--snapshots snapshots evenly spaced), in DIR/runs/NORM-NL. Then every snapshot is measured here:

\b
  (a) quality over training: the Frechet distance of the digit classifier's features between --num generated images
      and its training digits (bench/quickstart_quality.py; the digits' stand-in for the paper's Inception Score;
      lower is better);
  (b) L_D over training: metrics/lipschitz.py on --ld-num real and --ld-num generated images (1000: the
      `lipschitz1k` metric; the paper's is 50k + 50k on CIFAR-10), of f for SN and f_hat for GN;
  (c) the operator norm of each layer of the deepest SN and GN discriminators at their last snapshot
      (metrics/layer_norms.py).

Writes DIR/depth_study.json (every number, with the commands), then DIR/depth_study.png (the three panels; without
matplotlib one line says so), and prints the final L_D per depth and norm. The paper's own command is the same with
--cfg=cifar10-cnn on CIFAR-10 (docs/results.md).
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import glob
import os
import subprocess
import sys
import time

import click

import torch

import dnnlib
from bench import layer_norms as layer_norms_command
from bench import quickstart_quality
from bench.common import no_figure, pyplot, write_json_atomic
from metrics import layer_norms, metric_main
from torch_utils import persistence
from training.step.loss import NORMS, LossScore

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KIMG_PER_STEP = 0.016  # quickstart: a G step follows one D step of 16 reals.

#----------------------------------------------------------------------------


def int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(',') if part]
    except ValueError:
        raise click.BadParameter(f'"{text}" is not a comma-separated list of integers') from None


def train_run(run_outdir: str, options: list[str], steps: int, snapshots: int, log) -> str:
    """Run train.py (quickstart preset) with `options` for `steps` G steps and about `snapshots` snapshots; returns the
    run directory. A failed run raises a one-line ClickException with the end of its output."""
    tick = steps * KIMG_PER_STEP / snapshots
    command = [sys.executable, os.path.join(REPO, 'train.py'), f'--outdir={run_outdir}', '--cfg=quickstart',
               f'--steps={steps}', f'--tick={tick:g}', '--snap=1', '--metrics=none', '--device=cpu', *options]
    log(' '.join(['python train.py'] + command[2:]))
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ['(no output)']
        raise click.ClickException(f'train.py {" ".join(options)} failed: {tail[0]}')
    run_dirs = sorted(glob.glob(os.path.join(run_outdir, '*-digits32-quickstart-*')))
    return run_dirs[-1]


def snapshot_paths(run_dir: str) -> list[str]:
    return sorted(glob.glob(os.path.join(run_dir, 'network-snapshot-*.pkl')))


def measure_snapshot(path: str, judge: dict, num: int, ld_num: int, seed: int = 0) -> dict:
    """kimg, the classifier's FD and confident share, and L_D of one snapshot."""
    snapshot = persistence.load_snapshot(path)
    kimg = float(os.path.basename(path)[len('network-snapshot-'):-len('.pkl')])
    images, classes = quickstart_quality.generate(path, num, seed)
    quality = quickstart_quality.judge(judge['net'], images, classes, judge['ref_mu'], judge['ref_sigma'], threshold=0.9)
    dataset_kwargs = dnnlib.EasyDict(snapshot['training_set_kwargs'])
    result = metric_main.calc_metric('lipschitz1k', G=snapshot['G_ema'], D=snapshot['D'],
                                     d_score=LossScore(snapshot['experiment']['norm']), dataset_kwargs=dataset_kwargs,
                                     num_gen=ld_num, max_real=ld_num)
    return dict(kimg=kimg, step=round(kimg / KIMG_PER_STEP), fd=quality['fd'], confident=quality['confident'],
                l_d=result.results['lipschitz1k'])


def draw(plt, runs: dict, panel_c: dict, path: str) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.6))
    colors = plt.get_cmap('viridis')
    depths = sorted({run['depth'] for run in runs.values()})
    for name, run in runs.items():
        color = colors(depths.index(run['depth']) / max(1, len(depths) - 1))
        style = '-' if run['norm'] == 'gn' else '--'
        steps = [p['step'] for p in run['snapshots']]
        label = f'{run["norm"].upper()}-{run["depth"]}L'
        axes[0].plot(steps, [p['fd'] for p in run['snapshots']], style, color=color, marker='o', ms=3, label=label)
        axes[1].plot(steps, [p['l_d'] for p in run['snapshots']], style, color=color, marker='o', ms=3, label=label)
    axes[0].set_ylabel('FD of the digit classifier\'s features (lower is better)')
    axes[1].set_ylabel('L_D = max ||grad_x D(x)||')
    axes[1].set_yscale('log')
    axes[1].axhline(1.0, color='gray', linewidth=1)
    for ax, title in zip(axes[:2], ['(a) quality over training', '(b) L_D over training']):
        ax.set_xlabel('G step')
        ax.set_title(title)
        ax.legend(fontsize=7, ncol=2)
    if panel_c:
        layer_norms_command.draw_panel(axes[2], panel_c)
    axes[2].set_title('(c) Lipschitz constant of each layer, deepest D')
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


@click.command(help=__doc__)
@click.option('--outdir', required=True, type=click.Path(file_okay=False), help='Folder of the runs, the figure and the JSON.')
@click.option('--depths', default='3,5,7,9', show_default=True, callback=lambda ctx, param, value: int_list(value),
              help='Convolutional layers of G and D, comma-separated (3 to 16).')
@click.option('--norms', default='sn,gn', show_default=True, help='Constraints, comma-separated (any --norm).')
@click.option('--steps', default=400, show_default=True, type=click.IntRange(min=1), help='G steps per run.')
@click.option('--snapshots', default=5, show_default=True, type=click.IntRange(min=1), help='Snapshots per run.')
@click.option('--num', default=500, show_default=True, type=click.IntRange(min=2), help='Generated images of the quality score.')
@click.option('--ld-num', default=1000, show_default=True, type=click.IntRange(min=1), help='Real and generated images of L_D each.')
@click.option('--epochs', default=8, show_default=True, type=click.IntRange(min=1), help='Epochs of the digit classifier.')
def main(outdir: str, depths: list[int], norms: str, steps: int, snapshots: int, num: int, ld_num: int, epochs: int) -> None:
    norms = [norm for norm in norms.split(',') if norm]
    for norm in norms:
        if norm not in NORMS:
            raise click.BadParameter(f'unknown norm "{norm}"; valid: {", ".join(NORMS)}', param_hint='--norms')
    for depth in depths:
        if not 3 <= depth <= 16:
            raise click.BadParameter(f'{depth} is outside 3 to 16', param_hint='--depths')
    os.makedirs(outdir, exist_ok=True)
    log = lambda message: print(message, flush=True)
    start = time.time()
    judge = quickstart_quality.trained_judge(epochs, seed=0)
    log(f'digit classifier: held-out accuracy {judge["accuracy"]:.3f}')
    runs, commands = {}, []
    for depth in depths:
        for norm in norms:
            options = ['--loss=wasserstein', f'--norm={norm}', f'--depth={depth}']
            run_dir = train_run(os.path.join(outdir, 'runs', f'{norm}-{depth}L'), options, steps, snapshots, log)
            commands.append(' '.join(['python train.py --cfg=quickstart'] + options + [f'--steps={steps}']))
            points = [measure_snapshot(path, judge, num, ld_num) for path in snapshot_paths(run_dir)]
            runs[f'{norm}-{depth}L'] = dict(norm=norm, depth=depth, run_dir=run_dir, snapshots=points)
            log(f'{norm}-{depth}L: L_D ' + ', '.join(f'{p["l_d"]:.3g}' for p in points) + '; FD ' +
                ', '.join(f'{p["fd"]:.1f}' for p in points))
    deepest = max(depths)
    panel_c = {}
    for norm in norms:
        run = runs[f'{norm}-{deepest}L']
        last = persistence.load_snapshot(snapshot_paths(run['run_dir'])[-1])
        norms_of_layers = layer_norms.layer_norms(last['D'])
        run['layer_norms'] = [dict(name=n.name, operator_norm=n.operator_norm, sigma_reshaped=n.sigma_reshaped,
                                   sigma_raw=n.sigma_raw) for n in norms_of_layers]
        panel_c[f'{norm.upper()}-{deepest}L'] = norms_of_layers
    write_json_atomic(os.path.join(outdir, 'depth_study.json'), dict(
        commands=commands, classifier_accuracy=judge['accuracy'], steps=steps, ld_num=ld_num, num=num,
        torch=torch.__version__, seconds=time.time() - start, runs=runs))
    plt = pyplot()
    if plt is not None:
        draw(plt, runs, panel_c, os.path.join(outdir, 'depth_study.png'))
    log('')
    log('| depth | ' + ' | '.join(f'{norm.upper()} L_D (last) | {norm.upper()} FD (last)' for norm in norms) + ' |')
    log('|---|' + '---|---|' * len(norms))
    for depth in depths:
        cells = [f'{runs[f"{norm}-{depth}L"]["snapshots"][-1]["l_d"]:.3g} | {runs[f"{norm}-{depth}L"]["snapshots"][-1]["fd"]:.1f}'
                 for norm in norms]
        log(f'| {depth} | ' + ' | '.join(cells) + ' |')
    log(f'wrote {os.path.join(outdir, "depth_study.json")} ({time.time() - start:.0f} s); ' +
        ('and depth_study.png' if plt is not None else no_figure('depth_study.png')))


if __name__ == '__main__':
    main()  # pylint: disable=no-value-for-parameter
