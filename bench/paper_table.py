"""Several runs of one setting (seeds) in the paper's form: each run's best snapshot by FID, then mean +- std.

\b
    python -m bench.paper_table runs/cifar10-resnet-gn-seed*/00000-* --out=table-cifar10-resnet-gn
    python -m bench.paper_table runs/digits-seed0/00000-* runs/digits-seed1/00000-* --digits --out=table-digits

The paper reports, for each setting, the mean and standard deviation over 5 seeds of the best checkpoint of each
run by FID (its section "Experiments" and Table 2). This command does the same with the run directories of
train.py given to it, which must hold runs of one setting (the same --cfg, --norm, --loss and --cr):

\b
  * scores: the metrics recorded for the run's snapshots in its metric-<name>.jsonl files (train.py --metrics at
    every snapshot, or calc_metrics.py afterwards, e.g. FID(test) with --metrics=fid10k --ref-data=...); with
    --digits (runs on the embedded digits, which have no Inception statistics), every snapshot is judged by the
    digit classifier of bench/quickstart_quality.py instead (FD on its features, confident share, classes);
  * the best snapshot of a run: the lowest --best-metric (default: the first FID of the paper's columns that was
    recorded, fid50k_full for CIFAR-10 and STL-10; with --digits the classifier's FD);
  * per score, over the runs: the mean, the standard deviation (numpy's std, ddof=0, the population's) and the
    number of runs; beside it the paper's figure when the setting is one of the paper's rows (bench/paper.py).

Prints the table and writes <out>/paper_table.md and <out>/paper_table.json (every run's best snapshot and scores).
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import json
import os

import click

import numpy as np

from bench import paper
from bench.common import write_json_atomic
from dnnlib import util
from training.run import run_dirs

SETTING_KEYS = ('cfg', 'norm', 'loss', 'cr')
MAX_JSON_BYTES = 1 << 20    # training_options.json is a few kB; a metric line is one result of one snapshot.
MAX_METRIC_LINES = 100_000
DIGITS_SCORES = ('digits_fd', 'digits_confident', 'digits_classes')

#----------------------------------------------------------------------------
# Reading the runs.


def read_setting(run_dir: str) -> dict:
    """The options of a run that define its setting, and its seed, from training_options.json."""
    path = os.path.join(run_dir, 'training_options.json')
    try:
        if os.path.getsize(path) > MAX_JSON_BYTES:
            raise click.ClickException(f'{path} is larger than a training_options.json of train.py')
        with open(path, 'rt') as f:
            options = json.load(f)
        return {key: options[key] for key in (*SETTING_KEYS, 'seed')}
    except OSError:
        raise click.ClickException(f'{run_dir} is not a run directory of train.py (no readable training_options.json)')
    except (ValueError, KeyError, TypeError):
        raise click.ClickException(f'{path} is not a training_options.json of train.py')


def recorded_scores(run_dir: str) -> dict[str, dict[str, float]]:
    """Snapshot file name -> {result name: value} from the run's metric-<name>.jsonl (a later line of the same
    snapshot and result replaces an earlier one)."""
    scores: dict[str, dict[str, float]] = {}
    for name in sorted(os.listdir(run_dir)):
        if not (name.startswith('metric-') and name.endswith('.jsonl')):
            continue
        path = os.path.join(run_dir, name)
        with open(path, 'rt') as f:
            for number, line in enumerate(f, 1):
                if number > MAX_METRIC_LINES or len(line) > MAX_JSON_BYTES:
                    raise click.ClickException(f'{path}: more or longer lines than metric results hold')
                try:
                    entry = json.loads(line)
                    snapshot, results = entry['snapshot_pkl'], entry['results']
                    values = {str(key): float(value) for key, value in results.items()}
                except (ValueError, KeyError, TypeError, AttributeError):
                    raise click.ClickException(f'{path}, line {number}: not a metric result of calc_metrics.py or train.py')
                if isinstance(snapshot, str):
                    scores.setdefault(os.path.basename(snapshot), {}).update(values)
    return scores


def digit_scores(run_dir: str, judge_kit: dict, num: int) -> dict[str, dict[str, float]]:
    """Snapshot file name -> the digit classifier's scores of its generator (bench/quickstart_quality.py)."""
    from bench.quickstart_quality import generate, judge
    scores = {}
    for path in reversed(run_dirs.snapshots_newest_first(run_dir)):
        result = judge(judge_kit['net'], *generate(path, num, seed=0), judge_kit['ref_mu'], judge_kit['ref_sigma'], 0.9)
        scores[os.path.basename(path)] = dict(digits_fd=result['fd'], digits_confident=result['confident'],
                                              digits_classes=float(result['classes']))
    return scores


def best_snapshot(run_dir: str, scores: dict[str, dict[str, float]], best_metric: str) -> tuple[str, dict[str, float]]:
    """The snapshot with the lowest `best_metric`, and its scores."""
    scored = [(values[best_metric], name) for name, values in scores.items() if best_metric in values]
    if not scored:
        recorded = sorted({key for values in scores.values() for key in values})
        raise click.ClickException(f'{run_dir}: no snapshot has a recorded {best_metric} '
                                   f'(recorded: {", ".join(recorded) or "nothing"}); score them with calc_metrics.py, or, for runs '
                                   f'on the embedded digits, add --digits (the digit classifier scores every snapshot)')
    _, name = min(scored)
    return name, scores[name]

#----------------------------------------------------------------------------
# The table.


def aggregate(runs: list[dict], columns: list[str]) -> dict[str, dict]:
    """Per score: mean, std (ddof=0) and count over the runs that have it."""
    table = {}
    for column in columns:
        values = np.array([run['scores'][column] for run in runs if column in run['scores']], dtype=np.float64)
        table[column] = dict(mean=float(values.mean()), std=float(values.std()), n=int(len(values)))
    return table


def paper_figures(setting: dict) -> list[dict]:
    """The paper's rows that this setting reproduces, each with its figures under our result names."""
    dataset = paper.PRESET_DATASETS.get(setting['cfg'])
    result_of = dict(paper.COLUMNS[dataset]) if dataset else {}
    return [dict(table=row.table, section=row.section, method=row.method, note=row.note,
                 figures={result_of[column]: list(figure) for column, figure in row.figures.items()})
            for row in paper.rows_for(setting['cfg'], setting['norm'], setting['loss'], setting['cr'])]


def column_order(setting: dict, runs: list[dict]) -> list[str]:
    """The paper's columns first (in its order), then every other score of the best snapshots, sorted."""
    dataset = paper.PRESET_DATASETS.get(setting['cfg'])
    present = {key for run in runs for key in run['scores']}
    ours = [result for _, result in paper.COLUMNS.get(dataset, []) if result in present]
    digits = [key for key in DIGITS_SCORES if key in present]
    return ours + digits + sorted(present - set(ours) - set(digits))


def _figure(mean: float, std: float | None) -> str:
    return f'{mean:.2f}' if std is None else f'{mean:.2f} ± {std:.2f}'


def markdown(setting: dict, runs: list[dict], best_metric: str, columns: list[str], table: dict, rows: list[dict]) -> str:
    dataset = paper.PRESET_DATASETS.get(setting['cfg'])
    names = {result: column for column, result in paper.COLUMNS.get(dataset, [])}
    seeds = ', '.join(str(run['seed']) for run in runs)
    lines = [f'Setting: --cfg={setting["cfg"]} --norm={setting["norm"]} --loss={setting["loss"]} --cr={setting["cr"]:g}; '
             f'{len(runs)} runs (seeds {seeds}), each at its best snapshot by {best_metric}; '
             f'mean ± standard deviation over the runs (ddof=0).', '']
    header = ['score', 'ours', *[f'paper: {row["method"]} ({row["table"]})' for row in rows]]
    lines += ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    for column in columns:
        label = f'{names[column]} (`{column}`)' if column in names else f'`{column}`'
        cells = [label, f'{_figure(table[column]["mean"], table[column]["std"])} (n={table[column]["n"]})']
        cells += [_figure(*row['figures'][column]) if column in row['figures'] else '' for row in rows]
        lines.append('| ' + ' | '.join(cells) + ' |')
    lines += ['', '| run | seed | best snapshot | ' + ' | '.join(f'`{c}`' for c in columns) + ' |',
              '|' + '---|' * (3 + len(columns))]
    for run in runs:
        values = ' | '.join(f'{run["scores"][c]:.4g}' if c in run['scores'] else '' for c in columns)
        lines.append(f'| {run["run_dir"]} | {run["seed"]} | {run["snapshot"]} | {values} |')
    return '\n'.join(lines) + '\n'

#----------------------------------------------------------------------------


@click.command(help=__doc__)
@click.argument('run_dirs_', metavar='RUN_DIR...', nargs=-1, required=True)
@click.option('--out',          help='Folder for paper_table.md and paper_table.json', metavar='DIR', required=True)
@click.option('--best-metric',  help='Score (lower is better) that picks each run\'s best snapshot  [default: the first FID of the paper\'s columns recorded; --digits: digits_fd]', metavar='NAME')
@click.option('--digits',       help='Judge every snapshot with the digit classifier (runs on the embedded digits)', is_flag=True)
@click.option('--num',          help='--digits: generated images per snapshot', type=click.IntRange(min=2), default=2000, show_default=True)
def main(run_dirs_: tuple[str, ...], out: str, best_metric: str | None, digits: bool, num: int) -> None:
    run_dirs_ = [os.path.normpath(os.path.expanduser(path)) for path in run_dirs_]
    settings = [read_setting(run_dir) for run_dir in run_dirs_]
    setting = {key: settings[0][key] for key in SETTING_KEYS}
    for run_dir, other in zip(run_dirs_, settings):
        if any(other[key] != setting[key] for key in SETTING_KEYS):
            differs = ', '.join(f'{key} {other[key]} (not {setting[key]})' for key in SETTING_KEYS if other[key] != setting[key])
            raise click.ClickException(f'{run_dir} is another setting than {run_dirs_[0]}: {differs}')

    if digits:
        from bench.quickstart_quality import trained_judge
        print('Training the digit classifier...', flush=True)
        judge_kit = trained_judge(epochs=15, seed=0)
        scores = [digit_scores(run_dir, judge_kit, num) for run_dir in run_dirs_]
    else:
        scores = [recorded_scores(run_dir) for run_dir in run_dirs_]
    if best_metric is None:
        dataset = paper.PRESET_DATASETS.get(setting['cfg'])
        candidates = ['digits_fd'] if digits else [r for _, r in paper.COLUMNS.get(dataset, []) if r.startswith('fid')]
        recorded = {key for run_scores in scores for values in run_scores.values() for key in values}
        candidates += sorted(key for key in recorded if key.startswith('fid'))
        best_metric = next((key for key in candidates if key in recorded), candidates[0] if candidates else 'FID')

    runs = []
    for run_dir, run_setting, run_scores in zip(run_dirs_, settings, scores):
        snapshot, values = best_snapshot(run_dir, run_scores, best_metric)
        runs.append(dict(run_dir=run_dir, seed=run_setting['seed'], snapshot=snapshot, scores=values))
    columns = column_order(setting, runs)
    table = aggregate(runs, columns)
    rows = paper_figures(setting)
    text = markdown(setting, runs, best_metric, columns, table, rows)
    print(text, end='')

    os.makedirs(out, exist_ok=True)
    md_path = os.path.join(out, 'paper_table.md')
    with util.atomic_path(md_path) as tmp, open(tmp, 'wt') as f:
        f.write(text)
    write_json_atomic(os.path.join(out, 'paper_table.json'),
                      dict(setting=setting, best_metric=best_metric, runs=runs, columns=table, paper=rows))
    print(f'Wrote {md_path} and {os.path.join(out, "paper_table.json")}')


if __name__ == '__main__':
    main()
