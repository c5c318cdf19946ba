"""The value surfaces of the GN-GAN paper's appendix ("Decision Boundary Visualization"): what five constrained
discriminators learn on 2-D data, beside the optimal discriminator.

    python -m bench.value_surfaces --outdir=out/value-surfaces

A discriminator f, a 2-layer MLP with 512 hidden units (2 -> 512 -> ReLU -> 1), is trained alone (no generator
update) to tell a fixed sample of --num-real points of one Gaussian N(real_mean, real_cov) from fakes drawn afresh at
every step from another Gaussian N(fake_mean, fake_cov), with the non-saturating loss of the vanilla GAN, under each
of the paper's constraints:

\b
    vanilla   no constraint                              gp0   + 10 E[||grad f(x_mix)||^2] on interpolates
    gp1       + 10 E[(||grad f(x_mix)|| - 1)^2] (WGAN-GP)  sn    spectral normalization of both layers
    gn        the loss sees f_hat = f / (||grad_x f|| + |f|) (training/step/gradnorm.py)

The training step is the project's own loss (training/step/loss.py `GANLoss`, D step only), with a "generator"
that maps z ~ N(0, I) to fake_mean + A z, A A^T = fake_cov. Every panel shows, over a square grid, the score the
loss sees (f for the first four, f_hat for GN; a logit for the vanilla loss, so D's probability is its sigmoid),
and the first panel the optimum of that loss, D*(x) = p_r(x) / (p_r(x) + p_g(x)) (Goodfellow et al. 2014), a
probability. Writes value_surfaces.png and value_surfaces.npz: the grid's axes `x` and `y` (1-D; the arrays are
indexed [y, x]), one array per method (`vanilla`, `gp0`, `gp1`, `sn`, `gn`) and `optimal`, the two Gaussians as
`real_mean`, `real_cov`, `fake_mean`, `fake_cov`, the real sample as `real_points`, and `gn_grad_norm`, GN's
||grad_x f_hat|| at every grid point (autograd, through ||grad_x f||). Half a minute on a CPU.

What it shows: the vanilla D's logit is a steep cliff along the decision boundary (its slope, the gradient a fake
there receives, grows as D overfits the fixed real sample); the penalties and SN flatten it to differing degrees.
Under GN, ||grad_x f_hat|| = (n / (n + |f|))^2 <= 1 inside each linear region of the ReLU MLP (n = ||grad_x f||),
so f_hat rises by at most 1 per unit of distance between two points of one region; but f_hat jumps where a ReLU
switches (n changes, f does not), and a 512-unit MLP on the plane has so many regions that the slope between grid
points a step apart (0.05) reaches several units: f_hat is not 1-Lipschitz across regions (docs/results.md).
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import os

import click
import numpy as np

import torch
from torch import nn

from bench.common import no_figure, pyplot
from training.step.gradnorm import normalize_gradient
from training.step.loss import GANLoss

#----------------------------------------------------------------------------

METHODS = ('vanilla', 'gp0', 'gp1', 'sn', 'gn')
NORM_OF_METHOD = dict(vanilla='none', gp0='gp0', gp1='gp1', sn='sn', gn='gn')
TITLES = dict(optimal='optimal D* = p_r / (p_r + p_g)', vanilla='vanilla GAN: f', gp0='0-GP: f', gp1='1-GP: f',
              sn='SN: f', gn='GN: f_hat')

REAL_MEAN = np.array([-1.0, -0.5])
REAL_COV = np.array([[0.6, 0.25], [0.25, 0.4]])
FAKE_MEAN = np.array([1.2, 0.8])
FAKE_COV = np.array([[0.5, -0.2], [-0.2, 0.7]])


class MLPDiscriminator(nn.Module):
    """f(x) = w2 . relu(W1 x + b1) + b2 for x in R^2; called as D(x, c) with an unused [N, 0] label."""

    is_piecewise_linear = True     # ReLU and linear layers (training/step/gradnorm.py's speed-ups apply).
    is_sample_independent = True

    def __init__(self, hidden: int = 512, spectral_norm: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(2, hidden)
        self.fc2 = nn.Linear(hidden, 1)
        if spectral_norm:
            for layer in (self.fc1, self.fc2):
                nn.utils.parametrizations.spectral_norm(layer)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class GaussianSampler(nn.Module):
    """The fakes: z ~ N(0, I_2) -> mean + A z with A the Cholesky factor of cov; called as G(z, c)."""

    def __init__(self, mean: np.ndarray, cov: np.ndarray) -> None:
        super().__init__()
        self.register_buffer('mean', torch.tensor(mean, dtype=torch.float32))
        self.register_buffer('factor', torch.tensor(np.linalg.cholesky(cov), dtype=torch.float32))

    def forward(self, z: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return self.mean + z @ self.factor.T


def gaussian_density(points: np.ndarray, mean: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """N(points; mean, cov) for points [..., 2]: exp(-d^T cov^-1 d / 2) / (2 pi sqrt(det cov))."""
    d = points - mean
    mahalanobis = np.einsum('...i,ij,...j->...', d, np.linalg.inv(cov), d)
    return np.exp(-0.5 * mahalanobis) / (2 * np.pi * np.sqrt(np.linalg.det(cov)))


def train_discriminator(method: str, real_points: torch.Tensor, steps: int, lr: float, seed: int) -> MLPDiscriminator:
    """The MLP discriminator after `steps` D steps of the vanilla (non-saturating) loss under `method`."""
    torch.manual_seed(seed)
    D = MLPDiscriminator(spectral_norm=(method == 'sn'))
    G = GaussianSampler(FAKE_MEAN, FAKE_COV)
    loss = GANLoss(G=G, D=D, loss='ns', norm=NORM_OF_METHOD[method], gp_weight=10.0, precision='fp32')
    opt = torch.optim.Adam(D.parameters(), lr=lr, betas=(0.5, 0.999))
    no_label = torch.zeros([real_points.shape[0], 0])
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss.accumulate_gradients('D', real_points, no_label, torch.randn([len(real_points), 2]), no_label)
        opt.step()
    return D.eval()


def surface(method: str, D: MLPDiscriminator, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The score s the loss sees at `points` [N, 2] (f_hat under GN, else f) and ||grad_x s|| by autograd
    (through ||grad_x f|| for GN), both of shape [N]."""
    points = points.detach().requires_grad_(True)
    c = torch.zeros([points.shape[0], 0])
    score = normalize_gradient(D, points, c).f_hat[:, 0] if method == 'gn' else D(points, c)[:, 0]
    grad, = torch.autograd.grad(score.sum(), points)
    return score.detach(), grad.norm(dim=1)


def compute(steps: int = 1000, num_real: int = 256, lr: float = 1e-3, grid: int = 161,
            extent: float = 4.0, seed: int = 0) -> dict[str, np.ndarray]:
    """Every array of value_surfaces.npz (see the module docstring)."""
    rng = np.random.default_rng(seed)
    real_points = rng.multivariate_normal(REAL_MEAN, REAL_COV, size=num_real)
    x = np.linspace(-extent, extent, grid)
    y = np.linspace(-extent, extent, grid)
    xx, yy = np.meshgrid(x, y)  # [y, x]
    plane = np.stack([xx, yy], axis=-1)
    p_r, p_g = gaussian_density(plane, REAL_MEAN, REAL_COV), gaussian_density(plane, FAKE_MEAN, FAKE_COV)
    arrays = dict(x=x, y=y, optimal=p_r / (p_r + p_g), real_mean=REAL_MEAN, real_cov=REAL_COV, fake_mean=FAKE_MEAN,
                  fake_cov=FAKE_COV, real_points=real_points)
    reals = torch.tensor(real_points, dtype=torch.float32)
    points = torch.tensor(plane.reshape(-1, 2), dtype=torch.float32)
    for method in METHODS:
        D = train_discriminator(method, reals, steps=steps, lr=lr, seed=seed)
        score, grad_norm = surface(method, D, points)
        arrays[method] = score.double().numpy().reshape(grid, grid)
        if method == 'gn':
            arrays['gn_grad_norm'] = grad_norm.double().numpy().reshape(grid, grid)
    return arrays


def max_slope(values: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    """The largest |difference| / distance between horizontally or vertically neighbouring grid points."""
    return max(float(np.abs(np.diff(values, axis=1) / np.diff(x)[None, :]).max()),
               float(np.abs(np.diff(values, axis=0) / np.diff(y)[:, None]).max()))


def draw(plt, arrays: dict[str, np.ndarray], path: str) -> None:
    """The six panels: the optimum, then each method's surface with its own colour scale, reals and fakes on top."""
    fakes = np.random.default_rng(1).multivariate_normal(arrays['fake_mean'], arrays['fake_cov'], size=256)
    fig, axes = plt.subplots(1, 6, figsize=(24, 4.4))
    for ax, name in zip(axes, ('optimal',) + METHODS):
        values = arrays[name]
        image = ax.contourf(arrays['x'], arrays['y'], values, levels=30, cmap='viridis')
        ax.contour(arrays['x'], arrays['y'], values, levels=[0.5 if name == 'optimal' else 0.0], colors='white',
                   linewidths=1)
        ax.scatter(*arrays['real_points'].T, s=2, c='red', label='real (fixed)')
        ax.scatter(*fakes.T, s=2, c='black', label='fake (drawn afresh)')
        slope = max_slope(values, arrays['x'], arrays['y'])
        ax.set_title(f'{TITLES[name]}\nmax slope {slope:.3g}', fontsize=10)
        ax.set_aspect('equal')
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02)
    axes[0].legend(loc='lower right', fontsize=7, markerscale=4)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


@click.command(help=__doc__)
@click.option('--outdir', required=True, type=click.Path(file_okay=False), help='Folder of value_surfaces.png and .npz.')
@click.option('--steps', default=1000, show_default=True, type=click.IntRange(min=1), help='D steps per method.')
@click.option('--num-real', default=256, show_default=True, type=click.IntRange(min=1),
              help='Size of the fixed real sample, and the fakes drawn per step (the penalties pair them).')
@click.option('--grid', default=161, show_default=True, type=click.IntRange(min=2), help='Grid points per axis.')
@click.option('--seed', default=0, show_default=True, type=int, help='Seed of the real sample, the init and the fakes.')
def main(outdir: str, steps: int, num_real: int, grid: int, seed: int) -> None:
    torch.set_num_threads(min(torch.get_num_threads(), 2))
    try:
        os.makedirs(outdir, exist_ok=True)
    except OSError as error:
        raise click.ClickException(f'cannot create --outdir: {error}') from None
    arrays = compute(steps=steps, num_real=num_real, grid=grid, seed=seed)
    npz_path = os.path.join(outdir, 'value_surfaces.npz')
    png_path = os.path.join(outdir, 'value_surfaces.png')
    np.savez(npz_path + '.tmp.npz', **arrays)
    os.replace(npz_path + '.tmp.npz', npz_path)
    plt = pyplot()
    if plt is not None:
        draw(plt, arrays, png_path + '.tmp.png')
        os.replace(png_path + '.tmp.png', png_path)
    for name in ('optimal',) + METHODS:
        print(f'{name:8s} max slope between neighbouring grid points {max_slope(arrays[name], arrays["x"], arrays["y"]):8.4f}')
    print(f'wrote {npz_path} and {png_path}' if plt is not None else f'wrote {npz_path}; {no_figure(png_path)}')


if __name__ == '__main__':
    main()  # pylint: disable=no-value-for-parameter
