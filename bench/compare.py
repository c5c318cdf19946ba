"""Equal-budget comparisons: one preset under several discriminator constraints and losses, several seeds each.

\b
    python -m bench.compare --out=compare-sngan --settings=gn:hinge,sn:hinge,gp1:wasserstein,r1:ns,none:hinge \\
        --seeds=0,1,2 --steps=3000 --snaps=5

\b
    python -m bench.compare --out=compare-stylegan --cfg=gn-stylegan --settings=gn:hinge,r1:ns,none:ns \\
        --seeds=0,1,2 --kimg=24 --snaps=3 --extra="--cmax=32 --batch=32 --lod-kimg=6 --resolution=16 --xflip=0"

\b
    python -m bench.compare --out=compare-little-data --settings=gn:hinge,sn:hinge --augs=noaug,ada,diffaug \\
        --seeds=0,1 --steps=3000 --snaps=5 --extra="--subset=200"

Every (setting, seed) is one `train.py` run (--cfg, --norm, --loss, --seed, the same length for all,
plus --extra) into <out>/runs/<norm>-<loss>-seed<seed>/, with --snaps snapshots spread evenly over the
run; with --augs, every setting runs with each augmentation (train.py --aug; setting <norm>+<loss>+<aug>,
runs <norm>-<loss>-<aug>-seed<seed>/). Each snapshot is judged by the digit classifier of
bench/quickstart_quality.py (trained once, 2,000 samples per snapshot by default): the share of samples
read confidently as a digit, the number of digit classes among them, the share read as the class asked
for (conditional generators), the Frechet distance on the classifier's features against its training
split (FD) and against all 1,797 digits (FD all: with --subset, generalization beyond the images trained
on, not their memorization), and the leak check: the share of samples that the classifier reads
confidently only after undoing a rotation by 90, 180 or 270 degrees or a mirror (with or without a
rotation), which a generator shows when the augmentation leaks into its images. The runs are on the
embedded digits unless --extra names other --data (the classifier knows only digits). With --aug=ada|fixed,
each run's augmentation probability p and ADA's statistic r_t (the mean sign of D on reals) at every tick
are kept from its stats.jsonl (results.json; the final values in results.md).

Written to <out>: results.json (every score of every snapshot, the time per kimg of every run),
results.md (per setting the final scores as mean +- standard deviation over the seeds, and the
seconds per kimg), quality.png (confident share against kimg, a line per setting: the mean over
seeds, the range shaded; needs matplotlib, `pip install matplotlib`, otherwise skipped with a note)
and samples.png (a row of final samples per setting, seed 0). A finished run is recorded in
<out>/manifest.json and reused: a comparison that was interrupted, or that gets more settings or
seeds, continues where it stopped and merges the results; a run that did not finish is started again.
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import datetime
import glob
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time

import click

import torch

import numpy as np

from bench.common import no_figure, pyplot, write_json_atomic
from bench.quickstart_quality import classify, generate, judge, load_digits, trained_judge
from metrics.frechet_inception_distance import fid_from_stats
from torch_utils import misc
from training.experiment import QUICKSTART_DATA
from training.step import loss as loss_lib
from training.step.ada import AUGMENTS

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEASURES = ('confident', 'classes', 'as_asked', 'fd', 'fd_all', 'leak')
# The seven non-identity symmetries of the square, as they are undone on a sample [N, 1, H, W]: rotations, mirrors.
UNDO = [lambda x, k=k: torch.rot90(x, k, dims=(2, 3)) for k in (1, 2, 3)] + \
       [lambda x, k=k: torch.rot90(x.flip(3), k, dims=(2, 3)) for k in (0, 1, 2, 3)]

#----------------------------------------------------------------------------
# Arithmetic of the report.


def mean_spread(values: list[float | None]) -> tuple[float, float, int] | None:
    """(mean, sample standard deviation (0 for one value), count) of the values that are not None."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0, len(values)


def summarize(runs: list[dict]) -> list[dict]:
    """Per setting, in the order met: the final snapshot's measures over the seeds, and sec/kimg."""
    settings: dict[str, list[dict]] = {}
    for run in runs:
        settings.setdefault(run['setting'], []).append(run)
    rows = []
    for setting, group in settings.items():
        finals = [run['snapshots'][-1] for run in group if run['snapshots']]
        row = dict(setting=setting, seeds=sorted(run['seed'] for run in group),
                   kimg=finals[0]['kimg'] if finals else None,
                   sec_per_kimg=mean_spread([run['sec_per_kimg'] for run in group]))
        for measure in MEASURES:  # Scored before a measure existed: none of it.
            row[measure] = mean_spread([final.get(measure) for final in finals])
        row['p'] = mean_spread([run['augment'][-1]['p'] for run in group if run.get('augment')])
        row['r_t'] = mean_spread([run['augment'][-1]['r_t'] for run in group if run.get('augment')])
        rows.append(row)
    return rows


def _cell(stats: tuple[float, float, int] | None, fmt: str) -> str:
    return '' if stats is None else f'{stats[0]:{fmt}} +- {stats[1]:{fmt}}'


def markdown_table(rows: list[dict]) -> str:
    lines = ['| setting | seeds | kimg | confident | classes | as asked | FD | FD all | leak | p | r_t | sec/kimg |',
             '|---|---|---|---|---|---|---|---|---|---|---|---|']
    for row in rows:
        percent = lambda s: None if s is None else (100 * s[0], 100 * s[1], s[2])  # noqa: E731
        share = lambda s: _cell(percent(s), '.1f') + ('%' if s else '')  # noqa: E731
        lines.append(f'| {row["setting"]} | {len(row["seeds"])} | {row["kimg"]:g} | {_cell(percent(row["confident"]), ".1f")}% | '
                     f'{_cell(row["classes"], ".1f")} | {share(row["as_asked"])} | {_cell(row["fd"], ".1f")} | '
                     f'{_cell(row.get("fd_all"), ".1f")} | {share(row.get("leak"))} | {_cell(row.get("p"), ".3f")} | '
                     f'{_cell(row.get("r_t"), ".2f")} | {_cell(row["sec_per_kimg"], ".2f")} |')
    return '\n'.join(lines)

#----------------------------------------------------------------------------
# Runs.


def parse_settings(ctx: click.Context, param: click.Parameter, value: str) -> list[tuple[str, str]]:
    settings = []
    for item in value.split(','):
        norm, _, loss = item.strip().partition(':')
        if norm not in loss_lib.NORMS or loss not in loss_lib.LOSSES:
            raise click.BadParameter(f'"{item}" is not NORM:LOSS with NORM one of {", ".join(loss_lib.NORMS)} and LOSS '
                                     f'one of {", ".join(loss_lib.LOSSES)}')
        settings.append((norm, loss))
    return settings


def parse_augs(ctx: click.Context, param: click.Parameter, value: str) -> list[str | None]:
    """--augs: train.py --aug values, or [None] (each run with its preset's own)."""
    augs = [item.strip() for item in value.split(',')] if value else []
    for aug in augs:
        if aug not in AUGMENTS:
            raise click.BadParameter(f'"{aug}" is not one of {", ".join(AUGMENTS)}')
    return augs or [None]


def run_training(run_dir: str, cfg: str, norm: str, loss: str, seed: int, length: list[str], snaps: int,
                 extra: list[str]) -> str:
    """train.py for one (setting, seed) into a fresh `run_dir`; returns its run directory."""
    shutil.rmtree(run_dir, ignore_errors=True)  # An unfinished run starts again.
    dry = subprocess.run([sys.executable, 'train.py', f'--cfg={cfg}', *length, *extra, '--dry-run'], cwd=REPO_ROOT,
                         capture_output=True, text=True)
    if dry.returncode != 0:
        raise click.ClickException(f'train.py refuses --cfg={cfg} {" ".join(length + extra)}: {dry.stderr.strip()}')
    total_kimg = run_kimg(dry.stdout)
    tick = max(total_kimg / snaps, 1e-3)  # One tick per snapshot.
    command = [sys.executable, 'train.py', f'--outdir={run_dir}', f'--cfg={cfg}', f'--norm={norm}', f'--loss={loss}',
               f'--seed={seed}', *length, f'--tick={tick:.6g}', '--snap=1', *extra]
    with open(run_dir + '.log', 'w') as log:
        if subprocess.run(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
            raise click.ClickException(f'{shlex.join(command)} failed; see {run_dir}.log')
    return glob.glob(os.path.join(run_dir, '0*'))[0]


def run_kimg(dry_run_output: str) -> float:
    """The run length in kimg, from the schedule kwargs in the options that train.py --dry-run prints."""
    options = json.loads(dry_run_output[dry_run_output.index('{'):dry_run_output.index('\n}\n') + 2])
    schedule = options['schedule_kwargs']
    if 'total_kimg' in schedule:  # Progressive: its length is in kimg.
        return float(schedule['total_kimg'])
    return schedule['total_steps'] * schedule['n_dis'] * schedule['batch_D'] / 1000


def leak_share(net: torch.nn.Module, images: torch.Tensor, threshold: float = 0.9) -> float:
    """The share of `images` that the classifier does not read confidently as they are, but does after one of UNDO."""
    read = lambda x: classify(net, x)[0].max(axis=1) > threshold  # noqa: E731
    return float((~read(images) & np.any([read(undo(images)) for undo in UNDO], axis=0)).mean())


def all_digits_stats(net: torch.nn.Module) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance of the classifier's features of all 1,797 digits (FD all)."""
    _, feats = classify(net, load_digits(QUICKSTART_DATA)[0])
    return feats.mean(axis=0), np.cov(feats, rowvar=False)


def score_run(run_dir: str, judge_kit: dict, num: int, seed: int) -> dict:
    """Every snapshot of a run judged, the run's mean sec/kimg, and p and r_t at every tick (stats.jsonl)."""
    snapshots = []
    net = judge_kit['net']
    for path in sorted(glob.glob(os.path.join(run_dir, 'network-snapshot-*.pkl'))):
        label = os.path.basename(path)[len('network-snapshot-'):-len('.pkl')]
        images, classes = generate(path, num, seed)
        scores = judge(net, images, classes, judge_kit['ref_mu'], judge_kit['ref_sigma'], 0.9)
        feats = classify(net, images)[1]
        fd_all = fid_from_stats(feats.mean(axis=0), np.cov(feats, rowvar=False), *judge_kit['all_digits'])
        scores.update(fd_all=float(fd_all), leak=leak_share(net, images))
        snapshots.append(dict(kimg=float(label), path=os.path.relpath(path, REPO_ROOT), **{m: scores[m] for m in MEASURES}))
    with open(os.path.join(run_dir, 'stats.jsonl')) as f:
        ticks = [json.loads(line) for line in f]
    augment = [dict(kimg=tick['Progress/kimg']['mean'], p=tick.get('Progress/augment', {}).get('mean'),
                    r_t=tick['Loss/signs/real']['mean']) for tick in ticks if 'Loss/signs/real' in tick]
    speeds = [tick['Timing/sec_per_kimg']['mean'] for tick in ticks]
    return dict(snapshots=snapshots, augment=augment, sec_per_kimg=statistics.median(speeds) if speeds else None)

#----------------------------------------------------------------------------
# Pictures.


def write_chart(rows: list[dict], runs: list[dict], path: str) -> bool:
    """quality.png: confident share against kimg per setting (mean over seeds, min-max shaded); False without matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    for row in rows:
        group = [run for run in runs if run['setting'] == row['setting']]
        kimgs = sorted({s['kimg'] for run in group for s in run['snapshots']})
        per_kimg = [[s['confident'] for run in group for s in run['snapshots'] if s['kimg'] == k] for k in kimgs]
        mean = [100 * statistics.fmean(v) for v in per_kimg]
        line, = ax.plot(kimgs, mean, marker='o', label=row['setting'])
        ax.fill_between(kimgs, [100 * min(v) for v in per_kimg], [100 * max(v) for v in per_kimg], color=line.get_color(),
                        alpha=0.2)
    ax.set_xlabel('kimg (thousands of real images shown to D)')
    ax.set_ylabel('samples read confidently as a digit (%)')
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def write_samples(runs: list[dict], path: str, per_row: int = 16) -> None:
    """samples.png: `per_row` samples of each setting's final snapshot (its first seed), one row per setting."""
    rows = []
    for setting in dict.fromkeys(run['setting'] for run in runs):
        run = min((r for r in runs if r['setting'] == setting and r['snapshots']), key=lambda r: r['seed'], default=None)
        if run is not None:
            rows.append(generate(os.path.join(REPO_ROOT, run['snapshots'][-1]['path']), per_row, seed=0)[0])
    if rows:
        misc.save_image_grid(torch.cat(rows), path, (per_row, len(rows)))

#----------------------------------------------------------------------------


@click.command(help=__doc__)
@click.option('--out',      help='Folder of the comparison (runs, manifest, results)', metavar='DIR', required=True)
@click.option('--cfg',      help='Preset (train.py --cfg)', default='quickstart', show_default=True)
@click.option('--settings', help='Comma-separated NORM:LOSS pairs', default='gn:hinge,sn:hinge,gp1:wasserstein,r1:ns,none:hinge',
              show_default=True, callback=parse_settings)
@click.option('--seeds',    help='Seeds, comma-separated or a range (0-2)', default='0-2', show_default=True)
@click.option('--steps',    help='Length of every run in G steps (fixed-batch presets)', type=click.IntRange(min=1))
@click.option('--kimg',     help='Length of every run in thousands of real images (any preset)', type=click.FloatRange(min=0, min_open=True))
@click.option('--snaps',    help='Snapshots per run, spread evenly (each one is scored)', type=click.IntRange(min=1), default=5, show_default=True)
@click.option('--num',      help='Samples per scored snapshot', type=click.IntRange(min=10), default=2000, show_default=True)
@click.option('--augs',     help='Run every setting with each train.py --aug, comma-separated  [default: the preset\'s]',
              default='', callback=parse_augs)
@click.option('--ada-kimg', help='train.py --ada-kimg of the --augs=ada runs (p moves at most kimg / ada-kimg)',
              type=click.FloatRange(min=0, min_open=True))
@click.option('--extra',    help='More train.py options for every run, e.g. "--cmax=32 --batch=16"', default='', show_default=True)
def main(out: str, cfg: str, settings: list[tuple[str, str]], seeds: str, steps: int | None, kimg: float | None, snaps: int,
         num: int, augs: list[str | None], ada_kimg: float | None, extra: str) -> None:
    import dnnlib
    if (steps is None) == (kimg is None):
        raise click.ClickException('give the length of every run: --steps or --kimg (one of them)')
    try:
        seed_list = dnnlib.util.parse_int_list(seeds)
    except ValueError as e:
        raise click.ClickException(f'--seeds: {e}')
    length = [f'--steps={steps}'] if steps is not None else [f'--kimg={kimg:g}']
    extra_args = shlex.split(extra)
    if any(a.split('=')[0] in ('--outdir', '--norm', '--loss', '--seed', '--tick', '--snap', '--steps', '--kimg')
           for a in extra_args):
        raise click.ClickException('--extra must not set --outdir, --norm, --loss, --seed, --tick, --snap, --steps or --kimg')
    if augs != [None] and any(a.split('=')[0] == '--aug' for a in extra_args):
        raise click.ClickException('--extra must not set --aug with --augs')
    os.makedirs(os.path.join(out, 'runs'), exist_ok=True)
    manifest_path = os.path.join(out, 'manifest.json')
    manifest = json.load(open(manifest_path)) if os.path.exists(manifest_path) else dict(runs={})
    judge_kit = None
    todo = [(norm, loss, aug, seed) for norm, loss in settings for aug in augs for seed in seed_list]
    name = lambda norm, loss, aug, sep: sep.join([norm, loss] + ([aug] if aug else []))  # noqa: E731
    start = time.time()
    for i, (norm, loss, aug, seed) in enumerate(todo):
        setting, key = name(norm, loss, aug, '+'), f'{name(norm, loss, aug, "-")}-seed{seed}'
        run_extra = extra_args + ([f'--aug={aug}'] if aug else []) + \
            ([f'--ada-kimg={ada_kimg:g}'] if aug == 'ada' and ada_kimg is not None else [])
        identity = dict(cfg=cfg, length=length, extra=run_extra, snaps=snaps, num=num)
        done = manifest['runs'].get(key)
        if done is not None and done['identity'] == identity:
            print(f'[{i + 1}/{len(todo)}] {key}: done before, reused', flush=True)
            continue
        eta = '' if i == 0 else f', ETA {dnnlib.util.format_time((time.time() - start) / i * (len(todo) - i))}'
        print(f'[{i + 1}/{len(todo)}] {key}: training{eta}', flush=True)
        run_dir = run_training(os.path.join(out, 'runs', key), cfg, norm, loss, seed, length, snaps, run_extra)
        if judge_kit is None:
            judge_kit = trained_judge(epochs=15, seed=0)
            judge_kit['all_digits'] = all_digits_stats(judge_kit['net'])
        manifest['runs'][key] = dict(identity=identity, setting=setting, seed=seed, run_dir=os.path.relpath(run_dir, REPO_ROOT),
                                     **score_run(run_dir, judge_kit, num, seed))
        write_json_atomic(manifest_path, manifest)  # A finished run is never trained again.

    wanted = {f'{name(n, l, a, "-")}-seed{s}' for n, l in settings for a in augs for s in seed_list}
    runs = [run for key, run in manifest['runs'].items() if key in wanted]
    rows = summarize(runs)
    table = markdown_table(rows)
    write_json_atomic(os.path.join(out, 'results.json'), dict(
        cfg=cfg, length=length, extra=extra_args, seeds=seed_list, num=num, torch=torch.__version__,
        device='cuda' if torch.cuda.is_available() else f'CPU ({os.cpu_count()} cores)',
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'), summary=rows, runs=runs))
    with open(os.path.join(out, 'results.md'), 'w') as f:
        f.write(f'`--cfg={cfg} {" ".join(length + extra_args)}`, seeds {seeds}; final snapshots, mean +- standard '
                f'deviation over seeds; sec/kimg: median tick of each run, mean over seeds.\n\n{table}\n')
    print(table)
    if not write_chart(rows, runs, os.path.join(out, 'quality.png')):
        print(no_figure('quality.png'))
    write_samples(runs, os.path.join(out, 'samples.png'))
    print(f'Results in {out}: results.json, results.md, quality.png, samples.png')


if __name__ == '__main__':
    main()  # pylint: disable=no-value-for-parameter
