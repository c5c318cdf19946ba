"""Tests of the FID formula in metrics/frechet_inception_distance.py against independent computations."""

import numpy as np
import pytest
import scipy.linalg

from metrics import frechet_inception_distance


def random_spd(rng: np.random.Generator, dim: int, num_samples: int) -> np.ndarray:
    a = rng.standard_normal([num_samples, dim])
    return a.T @ a / num_samples


def fid_by_eigh(mu_a, sigma_a, mu_b, sigma_b) -> float:
    """tr((A B)^(1/2)) = tr((A^(1/2) B A^(1/2))^(1/2)), the latter symmetric PSD: sum of sqrt of eigenvalues."""
    w, v = np.linalg.eigh(sigma_a)
    sqrt_a = (v * np.sqrt(np.clip(w, 0, None))) @ v.T
    eig = np.linalg.eigvalsh(sqrt_a @ sigma_b @ sqrt_a)
    return float(np.sum((mu_a - mu_b) ** 2) + np.trace(sigma_a) + np.trace(sigma_b) - 2 * np.sqrt(np.clip(eig, 0, None)).sum())


def test_fid_matches_direct_computations():
    rng = np.random.default_rng(0)
    dim = 12
    mu_a, mu_b = rng.standard_normal(dim), rng.standard_normal(dim)
    sigma_a, sigma_b = random_spd(rng, dim, 40), random_spd(rng, dim, 30)
    fid = frechet_inception_distance.fid_from_stats(mu_a, sigma_a, mu_b, sigma_b)
    direct = np.sum((mu_a - mu_b) ** 2) + np.trace(sigma_a + sigma_b - 2 * scipy.linalg.sqrtm(sigma_a @ sigma_b).real)
    assert fid == pytest.approx(direct, rel=1e-9)
    assert fid == pytest.approx(fid_by_eigh(mu_a, sigma_a, mu_b, sigma_b), rel=1e-7)


def test_fid_of_identical_statistics_is_zero():
    rng = np.random.default_rng(1)
    mu, sigma = rng.standard_normal(16), random_spd(rng, 16, 64)
    assert abs(frechet_inception_distance.fid_from_stats(mu, sigma, mu, sigma)) < 1e-8


def test_fid_of_one_dimensional_gaussians():
    # Frechet distance of N(m1, s1^2) and N(m2, s2^2) is (m1 - m2)^2 + (s1 - s2)^2.
    fid = frechet_inception_distance.fid_from_stats(np.array([1.0]), np.array([[4.0]]), np.array([-0.5]), np.array([[0.25]]))
    assert fid == pytest.approx(1.5 ** 2 + (2.0 - 0.5) ** 2, rel=1e-12)


def test_fid_of_singular_covariances_is_finite_and_close():
    # Fewer samples than dimensions: rank-deficient covariances, as with tiny sample counts.
    rng = np.random.default_rng(2)
    dim = 10
    sigma_a, sigma_b = random_spd(rng, dim, 4), random_spd(rng, dim, 5)
    mu_a, mu_b = rng.standard_normal(dim), rng.standard_normal(dim)
    fid = frechet_inception_distance.fid_from_stats(mu_a, sigma_a, mu_b, sigma_b)
    assert np.isfinite(fid)
    assert fid == pytest.approx(fid_by_eigh(mu_a, sigma_a, mu_b, sigma_b), abs=1e-3)


def test_fid_rejects_mismatched_statistics():
    with pytest.raises(ValueError):
        frechet_inception_distance.fid_from_stats(np.zeros(3), np.eye(3), np.zeros(4), np.eye(4))
