"""Frechet Inception Distance (Heusel et al. 2017), as the official TensorFlow code (TTUR) computes it:
2048-d pool features of the TensorFlow Inception-v3 for real and generated images, a Gaussian fitted to
each set, and the Frechet distance between the two Gaussians.

The real side can also come from a file: an .npz holding `mu` [D] and `sigma` [D, D] of the real
features, the format in which the GN-GAN authors publish their references (cifar10.train.npz, ...)
and in which `write_ref_stats` saves the statistics of a dataset.
"""

from __future__ import annotations

import os
import zipfile
from typing import Callable

import numpy as np

from torch_utils import bounded_read

from . import detectors, features


INCEPTION_FEATURES = 2048  # D of the pool features of Inception-v3, the default detector.
MAX_REF_FEATURES = 4096    # Largest D read when the detector is not known yet (VGG16's 4096); sigma is then 128 MiB in float64.

# Tolerance of the covariance check, relative to the scale s = lambda_max(sigma) + ||mu||^2 (the spectral norm of
# the second moments E[x x^T] = sigma + mu mu^T, from which a covariance is computed and whose rounding it
# inherits): an asymmetry max |sigma - sigma^T| or a negative eigenvalue beyond 1e-3 s is no rounding error.
# Rounding perturbs the eigenvalues by at most about D * eps * s: 2.4e-4 s for float32 statistics of
# D = 4096 features (VGG16), far less for the float64 statistics this code computes itself.
COVARIANCE_RTOL = 1e-3


def _covariance_sqrt(what: str, mu: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """The symmetric square root of the covariance `sigma` (of the mean `mu`): from the eigendecomposition
    sigma = V diag(w) V^T, V diag(sqrt(max(w, 0))) V^T, negative eigenvalues being rounding. ValueError
    (one line, naming `what` the statistics are) where sigma is no covariance up to COVARIANCE_RTOL."""
    if not (np.isfinite(mu).all() and np.isfinite(sigma).all()):
        raise ValueError(f'{what} are not finite')
    w, v = np.linalg.eigh((sigma + sigma.T) / 2)
    scale = max(w[-1], 0.0) + float(mu @ mu)
    asymmetry = float(np.abs(sigma - sigma.T).max())
    if asymmetry > COVARIANCE_RTOL * scale:
        raise ValueError(f'{what}: sigma is not symmetric (max |sigma - sigma^T| = {asymmetry:.3g} at the scale '
                         f'{scale:.3g} of the statistics), so it is not a covariance')
    if w[0] < -COVARIANCE_RTOL * scale:
        raise ValueError(f'{what}: sigma has the negative eigenvalue {w[0]:.3g} (at the scale {scale:.3g} '
                         f'of the statistics), so it is not a covariance')
    return (v * np.sqrt(np.clip(w, 0, None))) @ v.T


def fid_from_stats(mu_a: np.ndarray, sigma_a: np.ndarray, mu_b: np.ndarray, sigma_b: np.ndarray) -> float:
    """Frechet distance between the Gaussians N(mu_a, sigma_a) and N(mu_b, sigma_b):

        d^2 = ||mu_a - mu_b||^2 + tr(sigma_a) + tr(sigma_b) - 2 tr((sigma_a sigma_b)^(1/2))

    in float64, exact for any positive semi-definite covariances, singular ones included (a collapsed
    generator, fewer images than features). The trace term is that of the Frechet (2-Wasserstein) distance:

        tr((sigma_a sigma_b)^(1/2)) = sum_i sqrt(lambda_i) = sum_i s_i

    with lambda_i >= 0 the eigenvalues of the symmetric PSD matrix M = sigma_a^(1/2) sigma_b sigma_a^(1/2)
    (sigma_a sigma_b = X Y and M = Y X for X = sigma_a^(1/2), Y = sigma_a^(1/2) sigma_b, and XY, YX have the
    same eigenvalues), and s_i the singular values of sigma_b^(1/2) sigma_a^(1/2), since M = (sigma_b^(1/2)
    sigma_a^(1/2))^T (sigma_b^(1/2) sigma_a^(1/2)). The square roots of sigma_a and sigma_b come from their
    eigendecompositions (`_covariance_sqrt`). The sum of singular values is used
    because it avoids squaring: where M is singular, rounding moves its zero eigenvalues by about
    eps ||M||, and their square roots by sqrt(eps ||M||), while a singular value moves by eps ||M||^(1/2).
    Symmetric eigensolvers and an SVD only, so neither an epsilon nor a general matrix square root (whose
    treatment of singular matrices varies across scipy versions) enters. Statistics that are not a
    covariance (non-finite, asymmetric or with a negative eigenvalue beyond COVARIANCE_RTOL) raise ValueError.
    """
    mu_a, mu_b = np.atleast_1d(np.asarray(mu_a, np.float64)), np.atleast_1d(np.asarray(mu_b, np.float64))
    sigma_a, sigma_b = np.atleast_2d(np.asarray(sigma_a, np.float64)), np.atleast_2d(np.asarray(sigma_b, np.float64))
    if mu_a.shape != mu_b.shape or sigma_a.shape != sigma_b.shape or sigma_a.shape != mu_a.shape * 2:
        raise ValueError(f'FID: mismatched statistics: means {mu_a.shape} and {mu_b.shape}, '
                         f'covariances {sigma_a.shape} and {sigma_b.shape}')
    sqrt_a = _covariance_sqrt('FID: the first statistics', mu_a, sigma_a)
    sqrt_b = _covariance_sqrt('FID: the second statistics', mu_b, sigma_b)
    trace_sqrt = np.linalg.svd(sqrt_b @ sqrt_a, compute_uv=False).sum()

    diff = mu_a - mu_b
    return float(diff @ diff + np.trace(sigma_a) + np.trace(sigma_b) - 2 * trace_sqrt)


def _accept_stats(name: str, ndim: int, num_features: int | None) -> Callable[[tuple[int, ...], np.dtype], str | None]:
    """The rule of bounded_read.ZipArchive.read_npy for mu (ndim 1) or sigma (ndim 2) of D = num_features
    (known) or of at most MAX_REF_FEATURES: shape [D] / [D, D], float32 or float64."""
    def accept(shape: tuple[int, ...], dtype: np.dtype) -> str | None:
        expected = '[D]' if ndim == 1 else '[D, D]'
        if dtype.kind != 'f' or dtype.itemsize not in (4, 8):
            return f'{name} is {dtype}, not float32 or float64'
        if len(shape) != ndim or len(set(shape)) != 1:
            return f'expected {name} {expected}, got {list(shape)}'
        if num_features is not None and shape[0] != num_features:
            return f'{name} is {list(shape)}, but the statistics are {num_features}-dimensional'
        if shape[0] > MAX_REF_FEATURES:
            return f'{name} is {list(shape)}: statistics of more than {MAX_REF_FEATURES} features are not read'
        return None
    return accept


def load_ref_stats(path: str, num_features: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(mu, sigma) of a reference statistics .npz, as float64; ValueError (one line) for anything else.

    mu must be [D] and sigma [D, D], float32 or float64, with D = `num_features` when given (the
    detector's; 2048 for Inception), else at most MAX_REF_FEATURES. Both are checked from the .npy
    headers and the archive's directory (torch_utils/bounded_read.py) before any data is read, so a
    file that claims more is refused within that module's bound, compressed or not: reading takes at
    most the file's size plus (D + D^2) * 8 bytes for each of the raw and the float64 arrays.
    """
    if not os.path.isfile(path):
        raise ValueError(f'reference statistics {path} do not exist')
    if not zipfile.is_zipfile(path):
        raise ValueError(f'{path} is not an .npz file of mu and sigma')
    with bounded_read.ZipArchive(path) as archive:  # Its RefusedFileError is a ValueError.
        names = [name[:-len('.npy')] for name in archive.entries if name.endswith('.npy')]
        if not {'mu', 'sigma'} <= set(names):
            raise ValueError(f'{path} holds {", ".join(names) or "no arrays"}, not mu and sigma')
        mu = archive.read_npy('mu.npy', _accept_stats('mu', 1, num_features)).astype(np.float64, copy=False)
        sigma = archive.read_npy('sigma.npy', _accept_stats('sigma', 2, len(mu))).astype(np.float64, copy=False)
    if not (np.isfinite(mu).all() and np.isfinite(sigma).all()):
        raise ValueError(f'{path}: the statistics are not finite')
    return mu, sigma


def _real_stats(opts: features.MetricOptions, max_real: int | None, use_ref_data: bool, detector_url: str,
                detector_kwargs: dict) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance of the real features: from opts.ref_stats when given, else from the data."""
    if opts.ref_stats is not None:
        mu, sigma = load_ref_stats(opts.ref_stats, INCEPTION_FEATURES if detector_url == detectors.INCEPTION_URL else None)
        opts.info.ref_stats = os.path.abspath(opts.ref_stats)
        return mu, sigma
    return features.compute_feature_stats_for_real(
        opts, use_ref_data=use_ref_data, detector_url=detector_url, detector_kwargs=detector_kwargs,
        max_items=max_real, capture_mean_cov=True).get_mean_cov()


def compute_fid(opts: features.MetricOptions, num_gen: int, max_real: int | None = None,
                use_ref_data: bool = False) -> float:
    """FID between `num_gen` generated images and up to `max_real` real images (None = all) of the
    training set, or of the reference split with `use_ref_data`, or the statistics of opts.ref_stats.
    NaN on ranks other than 0."""
    detector_url = opts.detector_url or detectors.INCEPTION_URL
    detector_kwargs = dict(return_features=True)
    mu_real, sigma_real = _real_stats(opts, max_real, use_ref_data, detector_url, detector_kwargs)
    mu_gen, sigma_gen = features.compute_feature_stats_for_generator(
        opts, detector_url=detector_url, detector_kwargs=detector_kwargs,
        max_items=num_gen, capture_mean_cov=True).get_mean_cov()

    if opts.rank != 0:
        return float('nan')
    if mu_real.shape != mu_gen.shape:
        raise ValueError(f'the reference statistics are {mu_real.shape[0]}-dimensional, but the detector '
                         f'{detector_url} gives {mu_gen.shape[0]} features')
    return fid_from_stats(mu_gen, sigma_gen, mu_real, sigma_real)


def write_ref_stats(opts: features.MetricOptions, path: str) -> int:
    """Write mu and sigma of the Inception features of all training images (opts.dataset_kwargs) to
    `path`, in the format of the authors' reference files, atomically (rank 0 writes). Returns the
    number of images."""
    detector_url = opts.detector_url or detectors.INCEPTION_URL
    stats = features.compute_feature_stats_for_real(opts, use_ref_data=False, detector_url=detector_url,
                                                    detector_kwargs=dict(return_features=True), capture_mean_cov=True)
    mu, sigma = stats.get_mean_cov()
    if opts.rank == 0:
        features.save_npz(path, dict(mu=mu, sigma=sigma))
    return stats.num_items
