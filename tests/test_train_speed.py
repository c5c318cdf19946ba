"""bench/train_speed.py: the fast-G variants each preset's D allows, --ch, and the refusals in one line."""

import time
import types

import click
import pytest
import torch
from click.testing import CliRunner

from bench import train_speed


def test_the_fast_g_step_is_timed_only_where_d_is_piecewise_linear(capsys):
    """GN's fast first-order G step is exact only for a piecewise-linear D: `both` (the default) times on and off there,
    and the exact step alone with a note elsewhere (gn-stylegan, gn-stylegan2); `on` is refused there in one line."""
    linear, smooth = types.SimpleNamespace(is_piecewise_linear=True), types.SimpleNamespace(is_piecewise_linear=False)
    assert train_speed.fast_variants('cifar10-resnet', linear, 'both') == [True, False]
    assert train_speed.fast_variants('cifar10-resnet', linear, 'on') == [True]
    assert capsys.readouterr().out == ''
    assert train_speed.fast_variants('gn-stylegan', smooth, 'both') == [False]
    assert capsys.readouterr().out == ('gn-stylegan: --fast-g=both times the exact G step alone: its D is not piecewise '
                                       'linear (no fast G step)\n')
    assert train_speed.fast_variants('gn-stylegan2', smooth, 'default') == [None]
    assert train_speed.fast_variants('gn-stylegan2', smooth, 'off') == [False]
    with pytest.raises(click.ClickException, match=r"^--fast-g=on: gn-stylegan2's D is not piecewise linear"):
        train_speed.fast_variants('gn-stylegan2', smooth, 'on')


def test_ch_narrows_the_sngan_networks_and_is_refused_for_stylegan():
    preset = train_speed.build_preset('cifar10-resnet', ['gn'], 2, None, None, torch.device('cpu'), ch=2)
    assert preset['G'].init_kwargs['ch'] == preset['Ds'][False].init_kwargs['ch'] == 2
    assert preset['Ds'][False].blocks[0].conv1.weight.shape == (2, 3, 3, 3)  # ch output maps from RGB.
    result = CliRunner().invoke(train_speed.main, ['--cfg=gn-stylegan', '--resolution=32', '--batch=4', '--ch=2',
                                                   '--device=cpu'])
    assert result.exit_code == 1 and result.output == 'Error: --ch: gn-stylegan is narrowed by --cmax\n'


def test_augmentation_costs_divide_each_augmented_row_by_its_own_noaug_row():
    """--augs: every augmented configuration over the same configuration without augmentation, and nothing else."""
    def row(aug, norm, d, g, precision='tf32'):
        return dict(cfg='c', norm=norm, fast_g=True, linear_d=True, fuse_d_calls=False, precision=precision,
                    cuda_graphs='off', aug=aug, sec_per_D_step=d, sec_per_G_step=g, sec_per_iteration=5 * d + g)
    rows = [row('noaug', 'gn', 1.0, 2.0), row('ada', 'gn', 3.0, 3.0), row('noaug', 'none', 0.5, 1.0),
            row('diffaug', 'none', 0.75, 1.5), row('ada', 'gn', 3.0, 3.0, precision='bf16')]  # The last: no noaug row.
    costs = train_speed.augmentation_costs(rows)
    assert [(c['norm'], c['aug'], c['precision']) for c in costs] == [('gn', 'ada', 'tf32'), ('none', 'diffaug', 'tf32')]
    assert (costs[0]['D'], costs[0]['G'], costs[0]['iteration']) == (3.0, 1.5, 18 / 7)
    assert (costs[1]['D'], costs[1]['G'], costs[1]['iteration']) == (1.5, 1.5, 1.5)


def test_augs_reach_the_loss_and_a_wrong_one_is_refused():
    preset = train_speed.build_preset('cifar10-resnet', ['gn'], 2, None, None, torch.device('cpu'), ch=2,
                                      augs=('noaug', 'ada', 'diffaug'))
    assert preset['aug_loss_kwargs'] == dict(noaug=None, diffaug=dict(aug='diffaug', diffaug='color,translation,cutout'),
                                             ada=dict(aug='ada', p=0.0, target=0.6, augpipe='bgc', ada_kimg=500))
    runs = {aug: train_speed.Configuration(preset, 'gn', None, None, None, 'fp32', torch.device('cpu'), time.perf_counter,
                                           aug=aug) for aug in ('noaug', 'ada', 'diffaug')}
    assert runs['noaug'].training.loss.augment is None
    assert [runs[aug].training.loss.augment.aug for aug in ('ada', 'diffaug')] == ['ada', 'diffaug']
    result = CliRunner().invoke(train_speed.main, ['--augs=noaug,fixed', '--device=cpu'])
    assert result.exit_code == 2 and result.output.strip().splitlines()[-1] == (
        'Error: Invalid value for \'--augs\': expected a comma-separated list of noaug, ada, diffaug; got "noaug,fixed"')
