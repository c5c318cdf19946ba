"""Improved precision and recall (Kynkaanniemi et al. 2019): k-nearest-neighbour manifolds of VGG16
features of real and generated images, as in StyleGAN2-ADA."""

from __future__ import annotations

from . import metric_utils


def compute_pr(opts: metric_utils.MetricOptions, max_real: int | None, num_gen: int, nhood_size: int,
               batch_size: int) -> tuple[float, float]:
    """Precision and recall of `num_gen` generated images against up to `max_real` training images
    (None = all), with neighbourhoods of `nhood_size`. NaN on ranks other than 0.

    The features come from opts.pr_detector_url when given, else from StyleGAN2-ADA's VGG16 export;
    the Inception detector option (opts.detector_url) never applies here."""
    detector_url = opts.pr_detector_url or metric_utils.VGG16_URL
    real_features, gen_features = metric_utils.compute_all_features(opts, detector_url, max_real=max_real, num_gen=num_gen)

    if opts.rank != 0:
        return float('nan'), float('nan')
    return metric_utils.precision_recall_from_features(real_features, gen_features, nhood_size=nhood_size,
                                                       batch_size=batch_size, device=opts.device)
