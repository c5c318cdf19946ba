"""bench/value_surfaces.py: the appendix's value surfaces, their arrays checked against independent computations."""

import os
import sys

import numpy as np
import pytest
import scipy.stats
import torch
from click.testing import CliRunner

from bench import value_surfaces


@pytest.fixture(scope='module')
def surfaces(tmp_path_factory) -> dict:
    """The command's .npz at a test size (300 D steps, 64 reals, a 41 x 41 grid)."""
    outdir = tmp_path_factory.mktemp('surfaces')
    result = CliRunner().invoke(value_surfaces.main, [f'--outdir={outdir}', '--steps=300', '--num-real=64', '--grid=41'])
    assert result.exit_code == 0, result.output
    assert os.path.getsize(outdir / 'value_surfaces.png') > 0
    return dict(np.load(outdir / 'value_surfaces.npz'))


def test_optimal_panel_is_the_density_ratio_of_the_stored_gaussians(surfaces):
    xx, yy = np.meshgrid(surfaces['x'], surfaces['y'])
    plane = np.stack([xx, yy], axis=-1)
    p_r = scipy.stats.multivariate_normal(surfaces['real_mean'], surfaces['real_cov']).pdf(plane)
    p_g = scipy.stats.multivariate_normal(surfaces['fake_mean'], surfaces['fake_cov']).pdf(plane)
    np.testing.assert_allclose(surfaces['optimal'], p_r / (p_r + p_g), rtol=1e-10, atol=1e-12)
    assert surfaces['optimal'].shape == (len(surfaces['y']), len(surfaces['x']))


def test_the_real_sample_is_drawn_from_the_stored_real_gaussian(surfaces):
    points = surfaces['real_points']
    assert abs(points.mean(axis=0) - surfaces['real_mean']).max() < 4 * np.sqrt(surfaces['real_cov'].max() / len(points))


def test_gn_gradient_is_bounded_by_one_and_vanilla_rises_faster(surfaces):
    """||grad f_hat|| <= 1 at every grid point (autograd through ||grad f||); the vanilla logit's slope between
    neighbouring grid points exceeds that bound, the surfaces of 0-GP, 1-GP and SN are much flatter than vanilla's."""
    assert surfaces['gn_grad_norm'].max() <= 1 + 1e-5
    assert np.abs(surfaces['gn']).max() <= 1
    slope = {name: value_surfaces.max_slope(surfaces[name], surfaces['x'], surfaces['y']) for name in value_surfaces.METHODS}
    assert slope['vanilla'] > 2
    assert max(slope['gp0'], slope['gp1'], slope['sn']) < slope['vanilla'] / 2


def mlp_in_float64(D: value_surfaces.MLPDiscriminator, points: np.ndarray) -> tuple[np.ndarray, ...]:
    """f, ||grad f|| and the ReLU pattern of the MLP at points [N, 2], from its weights in numpy float64."""
    W1, b1 = D.fc1.weight.detach().double().numpy(), D.fc1.bias.detach().double().numpy()
    w2, b2 = D.fc2.weight.detach().double().numpy()[0], D.fc2.bias.detach().double().numpy()[0]
    pre = points @ W1.T + b1
    active = pre > 0
    f = np.maximum(pre, 0) @ w2 + b2
    grad = (active * w2) @ W1  # sum_k w2_k [pre_k > 0] W1_k
    return f, np.linalg.norm(grad, axis=1), active


def test_gn_surface_rises_at_most_one_per_unit_inside_each_linear_region():
    """f_hat = f / (n + |f|) from the weights in float64 equals the command's GN surface; between neighbouring grid points
    with the same ReLU pattern (one convex linear region, so the segment between them stays in it) f_hat rises by at most
    1 per unit of distance, and the autograd gradient norm equals (n / (n + |f|))^2."""
    rng = np.random.default_rng(0)
    reals = torch.tensor(rng.multivariate_normal(value_surfaces.REAL_MEAN, value_surfaces.REAL_COV, size=64),
                         dtype=torch.float32)
    D = value_surfaces.train_discriminator('gn', reals, steps=200, lr=1e-3, seed=0)
    axis = np.linspace(-4, 4, 81)
    plane = np.stack(np.meshgrid(axis, axis), axis=-1).reshape(-1, 2)
    score, grad_norm = value_surfaces.surface('gn', D, torch.tensor(plane, dtype=torch.float32))
    f, n, active = mlp_in_float64(D, plane.astype(np.float32).astype(np.float64))
    f_hat = f / (n + np.abs(f))
    np.testing.assert_allclose(score.double().numpy(), f_hat, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(grad_norm.double().numpy(), (n / (n + np.abs(f))) ** 2, rtol=1e-3, atol=1e-6)

    f_hat, active = f_hat.reshape(81, 81), active.reshape(81, 81, -1)
    step = axis[1] - axis[0]
    slopes = []
    for dim in (0, 1):
        same_region = np.all(np.diff(active, axis=dim) == 0, axis=-1)
        slopes.append(np.abs(np.diff(f_hat, axis=dim))[same_region] / step)
    slopes = np.concatenate(slopes)
    assert len(slopes) > 300 and slopes.max() <= 1 + 1e-9


def test_bad_outdir_is_one_line(tmp_path):
    blocker = tmp_path / 'file'
    blocker.write_text('x')
    result = CliRunner().invoke(value_surfaces.main, [f'--outdir={blocker}/sub', '--steps=1', '--num-real=4', '--grid=3'])
    assert result.exit_code != 0 and 'Traceback' not in result.output and '--outdir' in result.output


def test_without_matplotlib_the_arrays_are_written_and_one_line_names_what_the_figure_needs(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, 'matplotlib', None)  # `import matplotlib` raises ImportError, as where it is absent.
    result = CliRunner().invoke(value_surfaces.main, [f'--outdir={tmp_path}', '--steps=2', '--num-real=4', '--grid=3'])
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(tmp_path)) == ['value_surfaces.npz']
    assert np.load(tmp_path / 'value_surfaces.npz')['optimal'].shape == (3, 3)
    assert result.output.splitlines()[-1] == (f'wrote {tmp_path}/value_surfaces.npz; {tmp_path}/value_surfaces.png not drawn: it '
                                              'needs matplotlib (pip install matplotlib); the numbers are written')
