"""bench/paper_table.py: several runs of one setting in the paper's form, checked against numpy on scores
written by hand."""

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

from bench import paper_table

# Three seeds of cifar10-resnet (GN, hinge), two snapshots each: (fid50k_full, fid10k, is50k_mean) per snapshot.
SCORES = {0: {'network-snapshot-000100.pkl': (14.0, 18.5, 8.1), 'network-snapshot-000200.pkl': (11.9, 16.0, 8.42)},
          1: {'network-snapshot-000100.pkl': (10.7, 14.9, 8.55), 'network-snapshot-000200.pkl': (12.3, 15.2, 8.3)},
          2: {'network-snapshot-000100.pkl': (13.1, 17.0, 8.2), 'network-snapshot-000200.pkl': (11.2, 15.6, 8.47)}}
BEST = {0: 'network-snapshot-000200.pkl', 1: 'network-snapshot-000100.pkl', 2: 'network-snapshot-000200.pkl'}  # Lowest fid50k_full.


def write_run(root, seed, scores, cfg='cifar10-resnet', norm='gn'):
    run_dir = root / f'seed{seed}' / f'00000-cifar10-{cfg}-{norm}'
    run_dir.mkdir(parents=True)
    (run_dir / 'training_options.json').write_text(json.dumps(dict(cfg=cfg, norm=norm, loss='hinge', cr=0.0, seed=seed, metrics=[])))
    for metric, index in [('fid50k_full', 0), ('fid10k', 1)]:
        with open(run_dir / f'metric-{metric}.jsonl', 'w') as f:
            for snapshot, values in scores.items():
                f.write(json.dumps(dict(results={metric: values[index]}, metric=metric, snapshot_pkl=snapshot)) + '\n')
    with open(run_dir / 'metric-is50k.jsonl', 'w') as f:
        for snapshot, values in scores.items():
            f.write(json.dumps(dict(results=dict(is50k_mean=values[2], is50k_std=0.1), metric='is50k', snapshot_pkl=snapshot)) + '\n')
    return str(run_dir)


def test_best_snapshots_mean_and_std_against_numpy_beside_the_papers_figures(tmp_path):
    run_dirs = [write_run(tmp_path, seed, scores) for seed, scores in SCORES.items()]
    result = CliRunner().invoke(paper_table.main, [*run_dirs, f'--out={tmp_path / "out"}'])
    assert result.exit_code == 0, result.output
    with open(tmp_path / 'out' / 'paper_table.json') as f:
        written = json.load(f)
    assert written['best_metric'] == 'fid50k_full'
    assert [run['snapshot'] for run in written['runs']] == [BEST[seed] for seed in SCORES]
    for index, name in enumerate(['fid50k_full', 'fid10k', 'is50k_mean']):
        values = np.array([SCORES[seed][BEST[seed]][index] for seed in SCORES])
        assert written['columns'][name]['mean'] == pytest.approx(values.mean(), abs=1e-12)
        assert written['columns'][name]['std'] == pytest.approx(np.sqrt(((values - values.mean()) ** 2).mean()), abs=1e-12)
        assert written['columns'][name]['n'] == 3
    # The paper's rows of this setting: Table 2's ResNet GN-GAN and the loss table's hinge row, both 8.49 / 11.13 / 15.33.
    assert {row['method'] for row in written['paper']} == {'(our) GN-GAN', 'Hinge'}
    markdown = (tmp_path / 'out' / 'paper_table.md').read_text()
    assert markdown in result.output
    line = next(line for line in markdown.splitlines() if line.startswith('| FID(test) (`fid10k`)'))
    assert '15.33 ± 0.16' in line and f'{np.mean([16.0, 14.9, 15.6]):.2f} ± {np.std([16.0, 14.9, 15.6]):.2f} (n=3)' in line


def test_refusals_are_one_line(tmp_path):
    run_a = write_run(tmp_path, 0, SCORES[0])
    run_b = write_run(tmp_path, 1, SCORES[1], norm='sn')
    digits_run = tmp_path / 'digits' / '00000-digits32-quickstart-gn'  # Scored by the digit classifier only (--digits).
    digits_run.mkdir(parents=True)
    (digits_run / 'training_options.json').write_text(json.dumps(dict(cfg='quickstart', norm='gn', loss='hinge', cr=0.0,
                                                                      seed=0, metrics=[])))
    for args, expected in [([run_a, run_b], 'norm sn (not gn)'),
                           ([run_a, '--best-metric=fid3k'], 'no snapshot has a recorded fid3k'),
                           ([str(digits_run)], 'no snapshot has a recorded FID (recorded: nothing); score them with '
                            'calc_metrics.py, or, for runs on the embedded digits, add --digits'),
                           ([str(tmp_path)], 'not a run directory')]:
        result = CliRunner().invoke(paper_table.main, [*args, f'--out={tmp_path / "out"}'])
        assert result.exit_code == 1 and expected in result.output and result.output.count('\n') == 1, result.output
    assert not (tmp_path / 'out').exists()


def test_a_later_line_of_the_same_snapshot_replaces_an_earlier_one(tmp_path):
    """calc_metrics.py run again on a snapshot appends a second line: the later result is the one that counts."""
    run_dir = write_run(tmp_path, 0, SCORES[0])
    snapshot = 'network-snapshot-000100.pkl'
    with open(os.path.join(run_dir, 'metric-fid50k_full.jsonl'), 'a') as f:
        line = dict(results=dict(fid50k_full=9.5), metric='fid50k_full', snapshot_pkl=f'/else/{snapshot}')
        f.write(json.dumps(line) + '\n')
    scores = paper_table.recorded_scores(run_dir)
    assert scores[snapshot] == dict(fid50k_full=9.5, fid10k=18.5, is50k_mean=8.1, is50k_std=0.1)
    assert paper_table.best_snapshot(run_dir, scores, 'fid50k_full') == (snapshot, scores[snapshot])
