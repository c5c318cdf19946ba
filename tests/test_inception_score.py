"""Tests of the IS formula in metrics/inception_score.py against a direct computation and known values."""

import numpy as np
import pytest

from metrics import inception_score


def inception_score_by_loops(probs: np.ndarray, num_splits: int) -> tuple[float, float]:
    n = len(probs)
    scores = []
    for s in range(num_splits):
        part = probs[s * n // num_splits : (s + 1) * n // num_splits]
        marginal = part.mean(axis=0)
        kls = [sum(p[y] * np.log(p[y] / marginal[y]) for y in range(len(p))) for p in part]
        scores.append(np.exp(np.mean(kls)))
    return float(np.mean(scores)), float(np.std(scores))


def test_is_matches_direct_computation():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal([53, 7]) * 2
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    mean, std = inception_score.is_from_probs(probs, num_splits=4)
    ref_mean, ref_std = inception_score_by_loops(probs, num_splits=4)
    assert mean == pytest.approx(ref_mean, rel=1e-10)
    assert std == pytest.approx(ref_std, rel=1e-8)


def test_is_of_confident_uniformly_spread_predictions_is_number_of_classes():
    num_classes, num_splits = 8, 10
    labels = np.tile(np.arange(num_classes), 3 * num_splits)  # Every split holds every class equally often.
    probs = np.eye(num_classes)[labels]
    mean, std = inception_score.is_from_probs(probs, num_splits=num_splits)
    assert mean == pytest.approx(num_classes, rel=1e-12)
    assert std == pytest.approx(0, abs=1e-12)


def test_is_of_identical_predictions_is_one():
    probs = np.tile([[0.2, 0.3, 0.5]], [20, 1])
    assert inception_score.is_from_probs(probs, num_splits=2)[0] == pytest.approx(1, rel=1e-12)
