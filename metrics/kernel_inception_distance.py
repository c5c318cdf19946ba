"""Kernel Inception Distance (Binkowski et al. 2018): an unbiased MMD estimate between the Inception
features of real and generated images, averaged over random subsets as in StyleGAN2-ADA."""

from __future__ import annotations

from . import metric_utils


def compute_kid(opts: metric_utils.MetricOptions, max_real: int | None, num_gen: int, num_subsets: int,
                max_subset_size: int) -> float:
    """KID between `num_gen` generated images and up to `max_real` training images (None = all).
    NaN on ranks other than 0."""
    detector_url = opts.detector_url or metric_utils.INCEPTION_URL
    real_features, gen_features = metric_utils.compute_all_features(opts, detector_url, max_real=max_real, num_gen=num_gen)

    if opts.rank != 0:
        return float('nan')
    return metric_utils.kid_from_features(gen_features, real_features, num_subsets=num_subsets,
                                          max_subset_size=max_subset_size, seed=opts.seed, device=opts.device)
