"""bench/depth_study.py at a tiny size: train.py runs, L_D and panel (c) of their snapshots, one-line errors."""

import json
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from bench import depth_study
from torch_utils import persistence
from tests.support.references import dense_norm


def test_tiny_study_measures_its_snapshots(tmp_path):
    result = CliRunner().invoke(depth_study.main, [f'--outdir={tmp_path}', '--depths=3', '--norms=sn,gn', '--steps=2',
                                                   '--snapshots=1', '--num=20', '--ld-num=10', '--epochs=1'])
    assert result.exit_code == 0, result.output
    assert (tmp_path / 'depth_study.png').stat().st_size > 0
    record = json.loads((tmp_path / 'depth_study.json').read_text())
    gn, sn = record['runs']['gn-3L'], record['runs']['sn-3L']
    assert all(0 < point['l_d'] <= 1 for point in gn['snapshots'])  # GN bounds ||grad f_hat|| by 1.
    # Panel (c): the first layer of the last GN snapshot's D, as applied to a 1x32x32 digit, against a dense SVD.
    last = persistence.load_snapshot(depth_study.snapshot_paths(gn['run_dir'])[-1])
    assert [layer['name'] for layer in gn['layer_norms']] == ['convs.0', 'convs.1', 'convs.2', 'fc']
    expected = dense_norm(last['D'].convs[0], (1, 32, 32))
    assert gn['layer_norms'][0]['operator_norm'] == pytest.approx(expected, rel=1e-4)
    fc = last['D'].fc.weight.detach().double().numpy()
    assert sn['layer_norms'][-1]['sigma_raw'] is not None and gn['layer_norms'][-1]['sigma_raw'] is None
    assert gn['layer_norms'][-1]['operator_norm'] == pytest.approx(np.linalg.norm(fc, ord=2), rel=1e-4)


@pytest.mark.parametrize('args, message', [(['--depths=2'], 'outside 3 to 16'), (['--norms=gn,foo'], 'unknown norm "foo"'),
                                           (['--depths=3,x'], 'not a comma-separated list')])
def test_bad_options_are_one_line(tmp_path, args, message):
    result = CliRunner().invoke(depth_study.main, [f'--outdir={tmp_path}', *args])
    assert result.exit_code != 0 and message in result.output and 'Traceback' not in result.output


def test_without_matplotlib_the_numbers_are_written_and_one_line_names_what_the_figure_needs(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, 'matplotlib', None)  # `import matplotlib` raises ImportError, as where it is absent.
    result = CliRunner().invoke(depth_study.main, [f'--outdir={tmp_path}', '--depths=3', '--norms=gn', '--steps=1',
                                                   '--snapshots=1', '--num=10', '--ld-num=4', '--epochs=1'])
    assert result.exit_code == 0, result.output
    assert list(json.loads((tmp_path / 'depth_study.json').read_text())['runs']) == ['gn-3L']
    assert not (tmp_path / 'depth_study.png').exists()
    assert result.output.splitlines()[-1].endswith('s); depth_study.png not drawn: it needs matplotlib (pip install '
                                                   'matplotlib); the numbers are written')
