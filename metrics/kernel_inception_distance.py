"""Kernel Inception Distance (Binkowski et al. 2018): an unbiased MMD estimate between the Inception
features of real and generated images, averaged over random subsets as in StyleGAN2-ADA."""

from __future__ import annotations

import numpy as np
import torch

from . import detectors, features


def kid_from_features(gen_features: np.ndarray | torch.Tensor, real_features: np.ndarray | torch.Tensor,
                      num_subsets: int = 100, max_subset_size: int = 1000, seed: int = 0,
                      device: torch.device | str = 'cpu') -> float:
    """Kernel Inception Distance (Binkowski et al. 2018), with StyleGAN2-ADA's subset protocol.

    With the cubic polynomial kernel k(a, b) = (a.b / d + 1)^3 on d-dimensional features, the
    unbiased estimate of the squared maximum mean discrepancy between subsets x (generated) and
    y (real) of m samples each is

        MMD^2 = sum_{i != j} [k(x_i, x_j) + k(y_i, y_j)] / (m (m - 1)) - 2 sum_{i,j} k(x_i, y_j) / m^2

    KID is its mean over `num_subsets` subsets of m = min(n_gen, n_real, max_subset_size) samples drawn
    without replacement (by a generator seeded with `seed`, so the result is reproducible).
    """
    x_all = torch.as_tensor(gen_features, device=device).to(torch.float64)
    y_all = torch.as_tensor(real_features, device=device).to(torch.float64)
    if x_all.ndim != 2 or y_all.ndim != 2 or x_all.shape[1] != y_all.shape[1]:
        raise ValueError(f'KID: mismatched feature sets {tuple(x_all.shape)} and {tuple(y_all.shape)}')
    d = x_all.shape[1]
    m = min(len(x_all), len(y_all), max_subset_size)
    if m < 2:
        raise ValueError('KID: needs at least 2 samples of each set')
    rng = np.random.default_rng(seed)
    total = 0.0
    for _subset in range(num_subsets):
        x = x_all[torch.from_numpy(rng.choice(len(x_all), m, replace=False)).to(device)]
        y = y_all[torch.from_numpy(rng.choice(len(y_all), m, replace=False)).to(device)]
        k_xx = (x @ x.T / d + 1) ** 3
        k_yy = (y @ y.T / d + 1) ** 3
        k_xy = (x @ y.T / d + 1) ** 3
        within = k_xx.sum() - k_xx.diagonal().sum() + k_yy.sum() - k_yy.diagonal().sum()
        total += float(within / (m * (m - 1)) - 2 * k_xy.sum() / (m * m))
    return total / num_subsets


def compute_kid(opts: features.MetricOptions, max_real: int | None, num_gen: int, num_subsets: int,
                max_subset_size: int) -> float:
    """KID between `num_gen` generated images and up to `max_real` training images (None = all).
    NaN on ranks other than 0."""
    detector_url = opts.detector_url or detectors.INCEPTION_URL
    real_features, gen_features = features.compute_all_features(opts, detector_url, max_real=max_real, num_gen=num_gen)

    if opts.rank != 0:
        return float('nan')
    return kid_from_features(gen_features, real_features, num_subsets=num_subsets,
                             max_subset_size=max_subset_size, seed=opts.seed, device=opts.device)
