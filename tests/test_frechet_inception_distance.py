"""Tests of the FID formula in metrics/frechet_inception_distance.py against independent computations.

References, none of them the code's own route (eigenvalues of sigma_a^(1/2) sigma_b sigma_a^(1/2)):
  * scipy.linalg.sqrtm of sigma_a sigma_b, where that product is well conditioned;
  * closed forms: a zero covariance (FID = |mu_a - mu_b|^2 + tr sigma_b), commuting covariances
    Q diag(a) Q^T and Q diag(b) Q^T (FID = |mu_a - mu_b|^2 + sum_i (sqrt(a_i) - sqrt(b_i))^2), one dimension;
  * for covariances of n and m samples (X, Y centred, [n, D] and [m, D]): sigma_a sigma_b =
    X^T X Y^T Y / ((n-1)(m-1)) has the nonzero eigenvalues of X Y^T (X Y^T)^T / ((n-1)(m-1)), so
    tr((sigma_a sigma_b)^(1/2)) is the sum of the singular values of X Y^T / sqrt((n-1)(m-1)), an SVD of
    an n x m matrix: exact however rank-deficient the covariances are (fewer samples than features).

Where a covariance is singular, the FID itself is ill-conditioned: rounding its entries (eps each) moves the
zero eigenvalues of sigma_a^(1/2) sigma_b sigma_a^(1/2) by about eps ||sigma_a|| ||sigma_b||, and the trace term by
up to the square root of that per eigenvalue. So computed covariances (not exactly diagonal ones) are compared
within `rounding_bound`, D sqrt(eps ||sigma_a|| ||sigma_b||): far below what an epsilon added to the diagonals
(the old fallback) or a wrong square root changes.
"""

import numpy as np
import pytest
import scipy.linalg
import scipy.stats

from metrics.frechet_inception_distance import COVARIANCE_RTOL, fid_from_stats


def centred(rng: np.random.Generator, num_samples: int, dim: int, scale: float = 1.0) -> np.ndarray:
    x = rng.standard_normal([num_samples, dim]) * scale
    return x - x.mean(axis=0)


def cov_of(x: np.ndarray) -> np.ndarray:
    """Covariance of centred samples x [n, D], as np.cov computes it."""
    return x.T @ x / (len(x) - 1)


def rounding_bound(sigma_a: np.ndarray, sigma_b: np.ndarray, dtype: type = np.float64) -> float:
    """D sqrt(eps ||sigma_a|| ||sigma_b||): how far rounding singular covariances to `dtype` moves their FID (module docstring)."""
    norms = np.linalg.norm(sigma_a, 2) * np.linalg.norm(sigma_b, 2)
    return len(sigma_a) * float(np.sqrt(np.finfo(dtype).eps * norms))


def fid_by_samples(mu_a: np.ndarray, x: np.ndarray, mu_b: np.ndarray, y: np.ndarray) -> float:
    """FID of N(mu_a, cov_of(x)) and N(mu_b, cov_of(y)) through the singular values of x y^T (module docstring)."""
    cross = x @ y.T / np.sqrt((len(x) - 1) * (len(y) - 1))
    trace_sqrt = np.linalg.svd(cross, compute_uv=False).sum()
    tr_a, tr_b = np.sum(x * x) / (len(x) - 1), np.sum(y * y) / (len(y) - 1)
    return float(np.sum((mu_a - mu_b) ** 2) + tr_a + tr_b - 2 * trace_sqrt)


def test_fid_matches_scipy_sqrtm_on_well_conditioned_covariances():
    rng = np.random.default_rng(0)
    dim = 12
    mu_a, mu_b = rng.standard_normal(dim), rng.standard_normal(dim)
    x, y = centred(rng, 40, dim), centred(rng, 30, dim)
    sigma_a, sigma_b = cov_of(x), cov_of(y)
    fid = fid_from_stats(mu_a, sigma_a, mu_b, sigma_b)
    direct = np.sum((mu_a - mu_b) ** 2) + np.trace(sigma_a + sigma_b - 2 * scipy.linalg.sqrtm(sigma_a @ sigma_b).real)
    assert fid == pytest.approx(direct, rel=1e-10)
    assert fid == pytest.approx(fid_by_samples(mu_a, x, mu_b, y), rel=1e-10)


@pytest.mark.parametrize('rank_b', [0, 3, 16])
def test_zero_covariance_gives_the_mean_distance_plus_the_other_trace(rank_b, monkeypatch):
    # N(mu_a, 0) is a point mass: the trace term vanishes exactly, whatever sigma_b (singular or not). Whatever
    # scipy's sqrtm does with the singular product (some versions return NaN for it), too.
    monkeypatch.setattr(scipy.linalg, 'sqrtm', lambda a, *args, **kwargs: np.full_like(a, np.nan))
    rng = np.random.default_rng(1)
    dim = 16
    mu_a, mu_b = rng.standard_normal(dim), rng.standard_normal(dim)
    sigma_b = cov_of(centred(rng, rank_b + 1, dim)) if rank_b else np.zeros([dim, dim])
    expected = np.sum((mu_a - mu_b) ** 2) + np.trace(sigma_b)
    assert fid_from_stats(mu_a, np.zeros([dim, dim]), mu_b, sigma_b) == pytest.approx(expected, rel=1e-14)
    assert fid_from_stats(mu_b, sigma_b, mu_a, np.zeros([dim, dim])) == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize('n,m,dim', [(4, 5, 10), (20, 30, 64), (3, 200, 64), (2, 2, 512), (30, 40, 256)])
def test_rank_deficient_covariances_of_fewer_samples_than_features(n, m, dim):
    rng = np.random.default_rng([n, m, dim])
    x, y = centred(rng, n, dim, scale=3.0), centred(rng, m, dim, scale=0.5)
    x[:, :dim // 2] *= 10  # Unequal feature scales, as in Inception features.
    mu_a, mu_b = rng.standard_normal(dim), rng.standard_normal(dim) + 1
    expected, bound = fid_by_samples(mu_a, x, mu_b, y), rounding_bound(cov_of(x), cov_of(y))
    assert fid_from_stats(mu_a, cov_of(x), mu_b, cov_of(y)) == pytest.approx(expected, abs=bound)
    assert fid_from_stats(mu_b, cov_of(y), mu_a, cov_of(x)) == pytest.approx(expected, abs=bound)


def test_commuting_singular_covariances_have_the_closed_form():
    # sigma_a = Q diag(a) Q^T, sigma_b = Q diag(b) Q^T: (sigma_a sigma_b)^(1/2) = Q diag(sqrt(a b)) Q^T, so
    # FID = |mu_a - mu_b|^2 + sum_i (sqrt(a_i) - sqrt(b_i))^2. Zeros on both diagonals, in different places.
    rng = np.random.default_rng(3)
    dim = 24
    a, b = rng.uniform(0.1, 9, dim), rng.uniform(0.1, 4, dim)
    a[[0, 5, 6, 17]] = 0
    b[[5, 9, 17, 20, 21]] = 0
    mu_a, mu_b = rng.standard_normal(dim), rng.standard_normal(dim)
    expected = np.sum((mu_a - mu_b) ** 2) + np.sum((np.sqrt(a) - np.sqrt(b)) ** 2)
    assert fid_from_stats(mu_a, np.diag(a), mu_b, np.diag(b)) == pytest.approx(expected, rel=1e-12)
    q = scipy.stats.ortho_group.rvs(dim, random_state=4)
    sigma_a, sigma_b = (q * a) @ q.T, (q * b) @ q.T
    assert fid_from_stats(mu_a, sigma_a, mu_b, sigma_b) == pytest.approx(expected, abs=rounding_bound(sigma_a, sigma_b))


def test_identical_statistics_give_zero_also_when_singular():
    rng = np.random.default_rng(5)
    mu = rng.standard_normal(32)
    for sigma in [cov_of(centred(rng, 100, 32)), cov_of(centred(rng, 6, 32)), np.zeros([32, 32])]:
        assert abs(fid_from_stats(mu, sigma, mu, sigma)) <= rounding_bound(sigma, sigma)


def test_fid_of_one_dimensional_gaussians():
    # Frechet distance of N(m1, s1^2) and N(m2, s2^2) is (m1 - m2)^2 + (s1 - s2)^2.
    fid = fid_from_stats(np.array([1.0]), np.array([[4.0]]), np.array([-0.5]), np.array([[0.25]]))
    assert fid == pytest.approx(1.5 ** 2 + (2.0 - 0.5) ** 2, rel=1e-14)


def test_float32_statistics_with_rounding_level_negative_eigenvalues_are_accepted():
    # A rank-deficient covariance computed and stored in float32 (as reference files are) has eigenvalues that
    # rounding makes slightly negative; they are no reason to refuse, and count as 0.
    rng = np.random.default_rng(6)
    dim = 256
    x = centred(rng, 40, dim, scale=5.0).astype(np.float32)
    mu = (rng.standard_normal(dim) * 3).astype(np.float32)
    sigma32 = np.cov(x, rowvar=False).astype(np.float32)
    assert np.linalg.eigvalsh(sigma32.astype(np.float64))[0] < 0
    y = centred(rng, 300, dim)
    fid = fid_from_stats(mu, sigma32, np.zeros(dim), cov_of(y))
    expected = fid_by_samples(mu.astype(np.float64), x.astype(np.float64), np.zeros(dim), y)
    assert fid == pytest.approx(expected, abs=rounding_bound(sigma32.astype(np.float64), cov_of(y), np.float32))


def test_statistics_that_are_not_covariances_are_refused_in_one_line():
    rng = np.random.default_rng(7)
    dim = 8
    mu, sigma = rng.standard_normal(dim), cov_of(centred(rng, 50, dim))
    scale = np.linalg.eigvalsh(sigma)[-1] + mu @ mu  # The tolerance's unit (see COVARIANCE_RTOL).
    w, v = np.linalg.eigh(sigma)

    def with_smallest_eigenvalue(value):
        return (v * np.concatenate([[value], w[1:]])) @ v.T

    refused = {
        'not symmetric': sigma + np.triu(np.ones([dim, dim]), 1) * 3 * COVARIANCE_RTOL * scale,
        'negative eigenvalue': with_smallest_eigenvalue(-3 * COVARIANCE_RTOL * scale),
        'not finite': np.where(np.eye(dim) > 0, np.nan, sigma),
    }
    for reason, bad in refused.items():
        for args in [(mu, bad, mu, sigma), (mu, sigma, mu, bad)]:
            with pytest.raises(ValueError, match=reason) as info:
                fid_from_stats(*args)
            assert '\n' not in str(info.value)
    with pytest.raises(ValueError, match='not finite'):
        fid_from_stats(np.full(dim, np.inf), sigma, mu, sigma)
    with pytest.raises(ValueError, match='mismatched statistics'):
        fid_from_stats(np.zeros(3), np.eye(3), np.zeros(4), np.eye(4))
    # Within the tolerance: accepted, the negative eigenvalue counted as 0 in the square root. Commuting with sigma,
    # FID = tr(nearly) + tr(sigma) - 2 sum_(i>0) w_i = value + w_0.
    value = -COVARIANCE_RTOL * scale / 3
    assert fid_from_stats(mu, with_smallest_eigenvalue(value), mu, sigma) == pytest.approx(value + w[0], abs=1e-7)
