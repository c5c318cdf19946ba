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

import numpy as np

from . import metric_utils


def load_ref_stats(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(mu, sigma) of a reference statistics .npz, as float64; ValueError (one line) for anything else."""
    if not os.path.isfile(path):
        raise ValueError(f'reference statistics {path} do not exist')
    if not zipfile.is_zipfile(path):
        raise ValueError(f'{path} is not an .npz file of mu and sigma')
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in ('mu', 'sigma') if name in data.files}
            names = data.files
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise ValueError(f'cannot read reference statistics {path}: {metric_utils._first_line(e)}') from e
    if len(arrays) != 2:
        raise ValueError(f'{path} holds {", ".join(names) or "no arrays"}, not mu and sigma')
    mu, sigma = arrays['mu'].astype(np.float64), arrays['sigma'].astype(np.float64)
    if mu.ndim != 1 or sigma.shape != mu.shape * 2:
        raise ValueError(f'{path}: expected mu [D] and sigma [D, D], got {list(mu.shape)} and {list(sigma.shape)}')
    if not (np.isfinite(mu).all() and np.isfinite(sigma).all()):
        raise ValueError(f'{path}: the statistics are not finite')
    return mu, sigma


def _real_stats(opts: metric_utils.MetricOptions, max_real: int | None, use_ref_data: bool, detector_url: str,
                detector_kwargs: dict) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance of the real features: from opts.ref_stats when given, else from the data."""
    if opts.ref_stats is not None:
        mu, sigma = load_ref_stats(opts.ref_stats)
        opts.info.ref_stats = os.path.abspath(opts.ref_stats)
        return mu, sigma
    return metric_utils.compute_feature_stats_for_real(
        opts, use_ref_data=use_ref_data, detector_url=detector_url, detector_kwargs=detector_kwargs,
        max_items=max_real, capture_mean_cov=True).get_mean_cov()


def compute_fid(opts: metric_utils.MetricOptions, num_gen: int, max_real: int | None = None,
                use_ref_data: bool = False) -> float:
    """FID between `num_gen` generated images and up to `max_real` real images (None = all) of the
    training set, or of the reference split with `use_ref_data`, or the statistics of opts.ref_stats.
    NaN on ranks other than 0."""
    detector_url = opts.detector_url or metric_utils.INCEPTION_URL
    detector_kwargs = dict(return_features=True)
    mu_real, sigma_real = _real_stats(opts, max_real, use_ref_data, detector_url, detector_kwargs)
    mu_gen, sigma_gen = metric_utils.compute_feature_stats_for_generator(
        opts, detector_url=detector_url, detector_kwargs=detector_kwargs,
        max_items=num_gen, capture_mean_cov=True).get_mean_cov()

    if opts.rank != 0:
        return float('nan')
    if mu_real.shape != mu_gen.shape:
        raise ValueError(f'the reference statistics are {mu_real.shape[0]}-dimensional, but the detector '
                         f'{detector_url} gives {mu_gen.shape[0]} features')
    return metric_utils.fid_from_stats(mu_gen, sigma_gen, mu_real, sigma_real)


def write_ref_stats(opts: metric_utils.MetricOptions, path: str) -> int:
    """Write mu and sigma of the Inception features of all training images (opts.dataset_kwargs) to
    `path`, in the format of the authors' reference files, atomically (rank 0 writes). Returns the
    number of images."""
    detector_url = opts.detector_url or metric_utils.INCEPTION_URL
    stats = metric_utils.compute_feature_stats_for_real(opts, use_ref_data=False, detector_url=detector_url,
                                                        detector_kwargs=dict(return_features=True), capture_mean_cov=True)
    mu, sigma = stats.get_mean_cov()
    if opts.rank == 0:
        metric_utils.save_npz(path, dict(mu=mu, sigma=sigma))
    return stats.num_items
