"""bench/train_speed.py: the fast-G variants each preset's D allows, --ch, and the refusals in one line."""

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
