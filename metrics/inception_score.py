"""Inception Score (Salimans et al. 2016), as the official code (openai/improved-gan) computes it: the
softmax over all 1008 logits of the TensorFlow Inception-v3, without the bias of the logits layer
(the official code multiplies the pool features by the layer's weights only), over 10 splits.
StyleGAN2-ADA's TorchScript export gives exactly these probabilities for `no_output_bias=True`."""

from __future__ import annotations

import numpy as np
import scipy.special

from . import detectors, features


def is_from_probs(probs: np.ndarray, num_splits: int = 10) -> tuple[float, float]:
    """Inception score (Salimans et al. 2016) of class probabilities p(y|x), one row per sample.

    The samples are cut into `num_splits` consecutive parts; for each part, with p(y) the part's
    mean prediction,

        IS = exp( mean_x KL(p(y|x) || p(y)) ) = exp( mean_x sum_y p(y|x) (log p(y|x) - log p(y)) )

    and the result is the mean and standard deviation of IS over the parts. Computed in float64
    with 0 log 0 = 0, so exactly one-hot predictions are handled too.
    """
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2 or len(probs) < num_splits:
        raise ValueError(f'IS: expected at least {num_splits} rows of class probabilities, got shape {probs.shape}')
    n = len(probs)
    scores = []
    for i in range(num_splits):
        part = probs[i * n // num_splits : (i + 1) * n // num_splits]
        marginal = part.mean(axis=0, keepdims=True)
        kl = scipy.special.xlogy(part, part) - scipy.special.xlogy(part, marginal)
        scores.append(np.exp(kl.sum(axis=1).mean()))
    return float(np.mean(scores)), float(np.std(scores))


def compute_is(opts: features.MetricOptions, num_gen: int, num_splits: int) -> tuple[float, float]:
    """Mean and standard deviation of the IS of `num_gen` generated images over `num_splits` splits.
    NaN on ranks other than 0."""
    detector_url = opts.detector_url or detectors.INCEPTION_URL
    gen_probs = features.compute_feature_stats_for_generator(
        opts, detector_url=detector_url, detector_kwargs=dict(no_output_bias=True),
        max_items=num_gen, capture_all=True).get_all()

    if opts.rank != 0:
        return float('nan'), float('nan')
    return is_from_probs(gen_probs, num_splits=num_splits)
