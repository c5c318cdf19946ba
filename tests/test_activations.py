"""bench/activations.py at a tiny size: each cell is a train.py run with its activation, scored; one-line errors."""

import json

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
