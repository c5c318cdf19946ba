"""bench/activations.py at a tiny size: each cell is a train.py run with its activation, scored; one-line errors."""

import json
import sys

import pytest
from click.testing import CliRunner

from bench import activations
from torch_utils import persistence


def test_tiny_grid_trains_each_activation(tmp_path):
    result = CliRunner().invoke(activations.main, [f'--outdir={tmp_path}', '--methods=gn', '--acts=softplus:20,relu',
                                                   '--steps=2', '--num=20', '--ld-num=10', '--epochs=1'])
    assert result.exit_code == 0, result.output
    assert (tmp_path / 'activations.png').stat().st_size > 0
    cells = json.loads((tmp_path / 'activations.json').read_text())['cells']
    for act, smooth in [('softplus:20', True), ('relu', False)]:
        cell = cells[f'gn-{act}']
        snapshot = persistence.load_snapshot(f'{cell["run_dir"]}/network-snapshot-000000.032.pkl')
        assert snapshot['D'].act == act and snapshot['D'].is_piecewise_linear == (not smooth)
        log = open(f'{cell["run_dir"]}/log.txt').read()
        assert ('GN: CNNDiscriminator is not piecewise linear' in log) == smooth
        assert 0 < cell['l_d'] and 0 <= cell['confident'] <= 1


@pytest.mark.parametrize('args, message', [(['--acts=relu,gelu'], 'unknown activation "gelu"'),
                                           (['--methods=gn,wgan'], 'unknown method "wgan"')])
def test_bad_options_are_one_line(tmp_path, args, message):
    result = CliRunner().invoke(activations.main, [f'--outdir={tmp_path}', *args])
    assert result.exit_code != 0 and message in result.output and 'Traceback' not in result.output


def test_without_matplotlib_the_numbers_are_written_and_one_line_names_what_the_chart_needs(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, 'matplotlib', None)  # `import matplotlib` raises ImportError, as where it is absent.
    result = CliRunner().invoke(activations.main, [f'--outdir={tmp_path}', '--methods=gn', '--acts=relu', '--steps=1',
                                                   '--num=10', '--ld-num=4', '--epochs=1'])
    assert result.exit_code == 0, result.output
    assert list(json.loads((tmp_path / 'activations.json').read_text())['cells']) == ['gn-relu']
    assert not (tmp_path / 'activations.png').exists()
    assert result.output.splitlines()[-1].endswith('s); activations.png not drawn: it needs matplotlib (pip install '
                                                   'matplotlib); the numbers are written')
