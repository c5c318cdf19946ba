"""Frechet Inception Distance (Heusel et al. 2017), as the official TensorFlow code (TTUR) computes it:
2048-d pool features of the TensorFlow Inception-v3 for real and generated images, a Gaussian fitted to
each set, and the Frechet distance between the two Gaussians."""

from __future__ import annotations

from . import metric_utils


def compute_fid(opts: metric_utils.MetricOptions, num_gen: int, max_real: int | None = None,
                use_ref_data: bool = False) -> float:
    """FID between `num_gen` generated images and up to `max_real` real images (None = all) of the
    training set, or of the reference split with `use_ref_data`. NaN on ranks other than 0."""
    detector_url = opts.detector_url or metric_utils.INCEPTION_URL
    detector_kwargs = dict(return_features=True)

    mu_real, sigma_real = metric_utils.compute_feature_stats_for_dataset(
        opts, dataset_kwargs=metric_utils.real_dataset_kwargs(opts, use_ref_data=use_ref_data),
        detector_url=detector_url, detector_kwargs=detector_kwargs,
        max_items=max_real, capture_mean_cov=True).get_mean_cov()
    mu_gen, sigma_gen = metric_utils.compute_feature_stats_for_generator(
        opts, detector_url=detector_url, detector_kwargs=detector_kwargs,
        max_items=num_gen, capture_mean_cov=True).get_mean_cov()

    if opts.rank != 0:
        return float('nan')
    return metric_utils.fid_from_stats(mu_gen, sigma_gen, mu_real, sigma_real)
