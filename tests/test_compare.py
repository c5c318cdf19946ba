"""bench/compare.py: the arithmetic of the report, and a tiny comparison written, resumed and merged."""

import glob
import json
import os
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from bench import compare


def _run(setting, seed, finals, sec_per_kimg):
    return dict(setting=setting, seed=seed, sec_per_kimg=sec_per_kimg,
                snapshots=[dict(kimg=1.0, confident=0.0, classes=0, as_asked=None, fd=999.0),
                           dict(kimg=2.0, **finals)])


def test_summary_is_mean_and_sample_std_of_the_final_snapshots():
    finals = [dict(confident=0.5, classes=9, as_asked=None, fd=30.0), dict(confident=0.7, classes=10, as_asked=None, fd=20.0),
              dict(confident=0.9, classes=10, as_asked=None, fd=10.0)]
    runs = [_run('gn+hinge', s, f, 2.0 + s) for s, f in enumerate(finals)] + [_run('sn+hinge', 0, finals[0], 1.0)]
    rows = compare.summarize(runs)
    assert [row['setting'] for row in rows] == ['gn+hinge', 'sn+hinge']
    gn = rows[0]
    for measure, values in [('confident', [0.5, 0.7, 0.9]), ('fd', [30.0, 20.0, 10.0]), ('classes', [9, 10, 10])]:
        mean, std, n = gn[measure]
        assert mean == pytest.approx(np.mean(values)) and std == pytest.approx(np.std(values, ddof=1)) and n == 3
    assert gn['as_asked'] is None and gn['seeds'] == [0, 1, 2] and gn['kimg'] == 2.0
    assert gn['sec_per_kimg'][:2] == pytest.approx((3.0, 1.0))
    assert rows[1]['confident'] == (0.5, 0.0, 1)  # One seed: no spread.
    table = compare.markdown_table(rows).splitlines()
    assert table[2] == '| gn+hinge | 3 | 2 | 70.0 +- 20.0% | 9.7 +- 0.6 |  | 20.0 +- 10.0 |  |  |  |  | 3.00 +- 1.00 |'


def test_leak_share_counts_samples_read_only_after_undoing_a_rotation_or_mirror():
    """A stand-in classifier confident exactly when the two top-left pixels of the first row are bright: a sample
    bright there is read as it is; one bright at the bottom right only after a half turn, one at the top right only
    after a mirror (leaks); others never."""
    import torch

    class TopLeftPair(torch.nn.Module):
        def features(self, x):
            return x[:, 0, 0, :2].sum(dim=1, keepdim=True)

        def out(self, f):
            return torch.cat([(f - 1) * 10, torch.zeros_like(f), torch.zeros_like(f)], dim=1)
    images = -torch.ones(5, 1, 4, 4)
    for i, pixels in enumerate([[(0, 0), (0, 1)], [(3, 3), (3, 2)], [(0, 3), (0, 2)], [(1, 1)]]):
        for y, x in pixels:
            images[i, 0, y, x] = 1
    assert compare.leak_share(TopLeftPair(), images) == pytest.approx(2 / 5)


def test_settings_are_checked():
    with pytest.raises(Exception, match='NORM:LOSS'):
        compare.parse_settings(None, None, 'gn:hinge,gn-hinge')
    assert compare.parse_settings(None, None, 'gn:hinge,r1:ns') == [('gn', 'hinge'), ('r1', 'ns')]


def test_a_tiny_comparison_is_written_resumed_and_merged(tmp_path, monkeypatch):
    """Two settings trained for real (train.py), scored and written; then one more seed of both: only the new runs are
    asked for, and the summary merges old and new. The new runs' training is a copy of the first seed's run (what is
    tested there is which runs are trained and how their scores merge), and the quick judge is trained once."""
    trained = []
    run_training = compare.run_training

    def copy_of_seed0(run_dir, cfg, norm, loss, seed, *args):
        shutil.copytree(os.path.join(os.path.dirname(run_dir), f'{norm}-{loss}-seed0'), run_dir)
        return glob.glob(os.path.join(run_dir, '0*'))[0]
    training = [run_training]
    monkeypatch.setattr(compare, 'run_training', lambda run_dir, *args: trained.append(os.path.basename(run_dir)) or
                        training[0](run_dir, *args))
    judges = {}
    judge = compare.trained_judge
    monkeypatch.setattr(compare, 'trained_judge', lambda epochs, seed: judges.get(seed) or judges.setdefault(
        seed, judge(1, seed)))  # A quick classifier will do, trained once.
    args = [f'--out={tmp_path}', '--steps=4', '--snaps=2', '--num=20', '--extra=--batch=4 --workers=0']
    result = CliRunner().invoke(compare.main, args + ['--settings=gn:hinge,none:hinge', '--seeds=0'])
    assert result.exit_code == 0, result.output
    assert trained == ['gn-hinge-seed0', 'none-hinge-seed0']
    for name in ('results.json', 'results.md', 'quality.png', 'samples.png', 'manifest.json'):
        assert (tmp_path / name).is_file(), name
    results = json.load(open(tmp_path / 'results.json'))
    assert [len(run['snapshots']) for run in results['runs']] == [2, 2]  # --snaps=2 over 4 steps of 4 reals.
    assert [s['kimg'] for s in results['runs'][0]['snapshots']] == [0.008, 0.016]
    # One more seed of both settings: only those runs train; the summary merges the old and the new.
    training[0] = copy_of_seed0
    result = CliRunner().invoke(compare.main, args + ['--settings=gn:hinge,none:hinge', '--seeds=0-1'])
    assert result.exit_code == 0, result.output
    assert trained[2:] == ['gn-hinge-seed1', 'none-hinge-seed1']
    merged = json.load(open(tmp_path / 'results.json'))
    assert [row['seeds'] for row in merged['summary']] == [[0, 1], [0, 1]]
    assert [run for run in merged['runs'] if run['seed'] == 0] == results['runs']  # Reused as they were scored.
    for row in merged['summary']:
        finals = [run['snapshots'][-1]['fd'] for run in merged['runs'] if run['setting'] == row['setting']]
        assert len(finals) == 2 and row['fd'] == pytest.approx((np.mean(finals), np.std(finals, ddof=1), 2))
