"""Inception Score (Salimans et al. 2016), as the official code (openai/improved-gan) computes it: the
softmax over all 1008 logits of the TensorFlow Inception-v3, without the bias of the logits layer
(the official code multiplies the pool features by the layer's weights only), over 10 splits.
StyleGAN2-ADA's TorchScript export gives exactly these probabilities for `no_output_bias=True`."""

from __future__ import annotations

from . import metric_utils


def compute_is(opts: metric_utils.MetricOptions, num_gen: int, num_splits: int) -> tuple[float, float]:
    """Mean and standard deviation of the IS of `num_gen` generated images over `num_splits` splits.
    NaN on ranks other than 0."""
    detector_url = opts.detector_url or metric_utils.INCEPTION_URL
    gen_probs = metric_utils.compute_feature_stats_for_generator(
        opts, detector_url=detector_url, detector_kwargs=dict(no_output_bias=True),
        max_items=num_gen, capture_all=True).get_all()

    if opts.rank != 0:
        return float('nan'), float('nan')
    return metric_utils.is_from_probs(gen_probs, num_splits=num_splits)
