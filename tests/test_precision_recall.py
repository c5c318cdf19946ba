"""Tests of the precision/recall formula in metrics/precision_recall.py against a direct k-NN computation."""

import numpy as np
import pytest

from metrics import precision_recall
from tests.support.references import fraction_in_manifold_by_loops


def test_precision_recall_match_direct_knn():
    rng = np.random.default_rng(6)
    real = rng.standard_normal([40, 3])
    gen = rng.standard_normal([30, 3]) * 0.6 + 1.5
    precision, recall = precision_recall.precision_recall_from_features(real, gen, nhood_size=3, batch_size=7)
    assert precision == pytest.approx(fraction_in_manifold_by_loops(real, gen, 3), abs=1e-12)
    assert recall == pytest.approx(fraction_in_manifold_by_loops(gen, real, 3), abs=1e-12)
    assert 0 < precision < 1 and 0 < recall < 1  # The test separates the sets only partly.


def test_precision_recall_of_identical_sets_are_one():
    feats = np.random.default_rng(7).standard_normal([25, 4])
    assert precision_recall.precision_recall_from_features(feats, feats, nhood_size=3) == (1.0, 1.0)
