"""Independent computations that the tests of several metrics compare against: FID with numpy and scipy, the
precision/recall manifold test by loops, a layer's operator norm by numpy's SVD of its dense matrix."""

from __future__ import annotations

import numpy as np
import scipy.linalg
import torch
from torch import nn


def fid_reference(features_a: np.ndarray, features_b: np.ndarray) -> float:
    """Direct FID of two feature sets with numpy's mean/cov and scipy's sqrtm."""
    mu_a, mu_b = features_a.mean(axis=0), features_b.mean(axis=0)
    sigma_a, sigma_b = np.cov(features_a, rowvar=False), np.cov(features_b, rowvar=False)
    return float(np.sum((mu_a - mu_b) ** 2) + np.trace(sigma_a + sigma_b - 2 * scipy.linalg.sqrtm(sigma_a @ sigma_b).real))


def fraction_in_manifold_by_loops(manifold: np.ndarray, probes: np.ndarray, k: int) -> float:
    radii = [np.sort([np.linalg.norm(a - b) for b in manifold])[k] for a in manifold]  # [0] is the point itself.
    inside = [any(np.linalg.norm(p - c) <= r for c, r in zip(manifold, radii)) for p in probes]
    return float(np.mean(inside))


def dense_norm(layer: nn.Module, input_shape: tuple) -> float:
    """sigma_max of the matrix of v -> layer(v) - layer(0), built column by column from the basis vectors, by numpy's SVD."""
    layer = layer.double().eval()
    size = int(np.prod(input_shape))
    with torch.no_grad():
        basis = torch.eye(size, dtype=torch.float64).reshape((size,) + tuple(input_shape))
        columns = (layer(basis) - layer(torch.zeros_like(basis[:1]))).reshape(size, -1)
    return float(np.linalg.svd(columns.numpy().T, compute_uv=False)[0])
