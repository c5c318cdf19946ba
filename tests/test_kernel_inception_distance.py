"""Tests of the KID formula in metrics/kernel_inception_distance.py against the unbiased MMD written out."""

import itertools

import numpy as np
import pytest

from metrics import kernel_inception_distance


def mmd2_unbiased_by_loops(x: np.ndarray, y: np.ndarray) -> float:
    d = x.shape[1]
    k = lambda a, b: (float(np.dot(a, b)) / d + 1) ** 3
    m = len(x)
    within = sum(k(x[i], x[j]) + k(y[i], y[j]) for i, j in itertools.product(range(m), repeat=2) if i != j)
    cross = sum(k(x[i], y[j]) for i, j in itertools.product(range(m), repeat=2))
    return within / (m * (m - 1)) - 2 * cross / (m * m)


def test_kid_matches_direct_unbiased_mmd():
    rng = np.random.default_rng(4)
    x = rng.standard_normal([9, 5])
    y = rng.standard_normal([9, 5]) * 1.5 + 0.3
    # Subsets as large as the sets are permutations of them, and the estimate is permutation invariant.
    kid = kernel_inception_distance.kid_from_features(x, y, num_subsets=3, max_subset_size=100)
    assert kid == pytest.approx(mmd2_unbiased_by_loops(x, y), rel=1e-10)


def test_kid_subsets_average_subset_estimates():
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal([30, 4]), rng.standard_normal([40, 4]) + 0.5
    kid = kernel_inception_distance.kid_from_features(x, y, num_subsets=4, max_subset_size=6, seed=7)
    # Replay the documented subset draws (generator seeded with `seed`, gen subset then real subset).
    draws = np.random.default_rng(7)
    ref = np.mean([mmd2_unbiased_by_loops(x[draws.choice(30, 6, replace=False)], y[draws.choice(40, 6, replace=False)])
                   for _subset in range(4)])
    assert kid == pytest.approx(ref, rel=1e-10)
