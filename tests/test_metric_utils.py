"""Tests of metrics/metric_utils.py: the metric math against independent computations, the feature
statistics, the statistics cache key, and the detector's failure message."""

import io
import itertools
import os
import zipfile

import numpy as np
import PIL.Image
import pytest
import scipy.linalg
import torch

from metrics import metric_utils

#----------------------------------------------------------------------------
# Independent references.


def random_spd(rng: np.random.Generator, dim: int, num_samples: int) -> np.ndarray:
    a = rng.standard_normal([num_samples, dim])
    return a.T @ a / num_samples


def fid_by_eigh(mu_a, sigma_a, mu_b, sigma_b) -> float:
    """tr((A B)^(1/2)) = tr((A^(1/2) B A^(1/2))^(1/2)), the latter symmetric PSD: sum of sqrt of eigenvalues."""
    w, v = np.linalg.eigh(sigma_a)
    sqrt_a = (v * np.sqrt(np.clip(w, 0, None))) @ v.T
    eig = np.linalg.eigvalsh(sqrt_a @ sigma_b @ sqrt_a)
    return float(np.sum((mu_a - mu_b) ** 2) + np.trace(sigma_a) + np.trace(sigma_b) - 2 * np.sqrt(np.clip(eig, 0, None)).sum())


def inception_score_by_loops(probs: np.ndarray, num_splits: int) -> tuple[float, float]:
    n = len(probs)
    scores = []
    for s in range(num_splits):
        part = probs[s * n // num_splits : (s + 1) * n // num_splits]
        marginal = part.mean(axis=0)
        kls = [sum(p[y] * np.log(p[y] / marginal[y]) for y in range(len(p))) for p in part]
        scores.append(np.exp(np.mean(kls)))
    return float(np.mean(scores)), float(np.std(scores))


def mmd2_unbiased_by_loops(x: np.ndarray, y: np.ndarray) -> float:
    d = x.shape[1]
    k = lambda a, b: (float(np.dot(a, b)) / d + 1) ** 3
    m = len(x)
    within = sum(k(x[i], x[j]) + k(y[i], y[j]) for i, j in itertools.product(range(m), repeat=2) if i != j)
    cross = sum(k(x[i], y[j]) for i, j in itertools.product(range(m), repeat=2))
    return within / (m * (m - 1)) - 2 * cross / (m * m)


def fraction_in_manifold_by_loops(manifold: np.ndarray, probes: np.ndarray, k: int) -> float:
    radii = [np.sort([np.linalg.norm(a - b) for b in manifold])[k] for a in manifold]  # [0] is the point itself.
    inside = [any(np.linalg.norm(p - c) <= r for c, r in zip(manifold, radii)) for p in probes]
    return float(np.mean(inside))

#----------------------------------------------------------------------------
# FID.


def test_fid_matches_direct_computations():
    rng = np.random.default_rng(0)
    dim = 12
    mu_a, mu_b = rng.standard_normal(dim), rng.standard_normal(dim)
    sigma_a, sigma_b = random_spd(rng, dim, 40), random_spd(rng, dim, 30)
    fid = metric_utils.fid_from_stats(mu_a, sigma_a, mu_b, sigma_b)
    direct = np.sum((mu_a - mu_b) ** 2) + np.trace(sigma_a + sigma_b - 2 * scipy.linalg.sqrtm(sigma_a @ sigma_b).real)
    assert fid == pytest.approx(direct, rel=1e-9)
    assert fid == pytest.approx(fid_by_eigh(mu_a, sigma_a, mu_b, sigma_b), rel=1e-7)


def test_fid_of_identical_statistics_is_zero():
    rng = np.random.default_rng(1)
    mu, sigma = rng.standard_normal(16), random_spd(rng, 16, 64)
    assert abs(metric_utils.fid_from_stats(mu, sigma, mu, sigma)) < 1e-8


def test_fid_of_one_dimensional_gaussians():
    # Frechet distance of N(m1, s1^2) and N(m2, s2^2) is (m1 - m2)^2 + (s1 - s2)^2.
    fid = metric_utils.fid_from_stats(np.array([1.0]), np.array([[4.0]]), np.array([-0.5]), np.array([[0.25]]))
    assert fid == pytest.approx(1.5 ** 2 + (2.0 - 0.5) ** 2, rel=1e-12)


def test_fid_of_singular_covariances_is_finite_and_close():
    # Fewer samples than dimensions: rank-deficient covariances, as with tiny sample counts.
    rng = np.random.default_rng(2)
    dim = 10
    sigma_a, sigma_b = random_spd(rng, dim, 4), random_spd(rng, dim, 5)
    mu_a, mu_b = rng.standard_normal(dim), rng.standard_normal(dim)
    fid = metric_utils.fid_from_stats(mu_a, sigma_a, mu_b, sigma_b)
    assert np.isfinite(fid)
    assert fid == pytest.approx(fid_by_eigh(mu_a, sigma_a, mu_b, sigma_b), abs=1e-3)


def test_fid_rejects_mismatched_statistics():
    with pytest.raises(ValueError):
        metric_utils.fid_from_stats(np.zeros(3), np.eye(3), np.zeros(4), np.eye(4))

#----------------------------------------------------------------------------
# IS.


def test_is_matches_direct_computation():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal([53, 7]) * 2
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    mean, std = metric_utils.is_from_probs(probs, num_splits=4)
    ref_mean, ref_std = inception_score_by_loops(probs, num_splits=4)
    assert mean == pytest.approx(ref_mean, rel=1e-10)
    assert std == pytest.approx(ref_std, rel=1e-8)


def test_is_of_confident_uniformly_spread_predictions_is_number_of_classes():
    num_classes, num_splits = 8, 10
    labels = np.tile(np.arange(num_classes), 3 * num_splits)  # Every split holds every class equally often.
    probs = np.eye(num_classes)[labels]
    mean, std = metric_utils.is_from_probs(probs, num_splits=num_splits)
    assert mean == pytest.approx(num_classes, rel=1e-12)
    assert std == pytest.approx(0, abs=1e-12)


def test_is_of_identical_predictions_is_one():
    probs = np.tile([[0.2, 0.3, 0.5]], [20, 1])
    assert metric_utils.is_from_probs(probs, num_splits=2)[0] == pytest.approx(1, rel=1e-12)

#----------------------------------------------------------------------------
# KID and precision/recall.


def test_kid_matches_direct_unbiased_mmd():
    rng = np.random.default_rng(4)
    x = rng.standard_normal([9, 5])
    y = rng.standard_normal([9, 5]) * 1.5 + 0.3
    # Subsets as large as the sets are permutations of them, and the estimate is permutation invariant.
    kid = metric_utils.kid_from_features(x, y, num_subsets=3, max_subset_size=100)
    assert kid == pytest.approx(mmd2_unbiased_by_loops(x, y), rel=1e-10)


def test_kid_subsets_average_subset_estimates():
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal([30, 4]), rng.standard_normal([40, 4]) + 0.5
    kid = metric_utils.kid_from_features(x, y, num_subsets=4, max_subset_size=6, seed=7)
    # Replay the documented subset draws (generator seeded with `seed`, gen subset then real subset).
    draws = np.random.default_rng(7)
    ref = np.mean([mmd2_unbiased_by_loops(x[draws.choice(30, 6, replace=False)], y[draws.choice(40, 6, replace=False)])
                   for _subset in range(4)])
    assert kid == pytest.approx(ref, rel=1e-10)


def test_precision_recall_match_direct_knn():
    rng = np.random.default_rng(6)
    real = rng.standard_normal([40, 3])
    gen = rng.standard_normal([30, 3]) * 0.6 + 1.5
    precision, recall = metric_utils.precision_recall_from_features(real, gen, nhood_size=3, batch_size=7)
    assert precision == pytest.approx(fraction_in_manifold_by_loops(real, gen, 3), abs=1e-12)
    assert recall == pytest.approx(fraction_in_manifold_by_loops(gen, real, 3), abs=1e-12)
    assert 0 < precision < 1 and 0 < recall < 1  # The test separates the sets only partly.


def test_precision_recall_of_identical_sets_are_one():
    feats = np.random.default_rng(7).standard_normal([25, 4])
    assert metric_utils.precision_recall_from_features(feats, feats, nhood_size=3) == (1.0, 1.0)

#----------------------------------------------------------------------------
# Feature statistics.


def test_feature_stats_mean_cov_truncation_and_round_trip(tmp_path):
    rng = np.random.default_rng(8)
    feats = rng.standard_normal([50, 6]).astype(np.float32) * 3 + 1
    stats = metric_utils.FeatureStats(capture_all=True, capture_mean_cov=True, max_items=37)
    for batch in np.split(feats, [8, 16, 30, 45]):
        stats.append(torch.from_numpy(batch))
    assert stats.is_full() and stats.num_items == 37
    mean, cov = stats.get_mean_cov()
    np.testing.assert_allclose(mean, feats[:37].astype(np.float64).mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(cov, np.cov(feats[:37].astype(np.float64), rowvar=False), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(stats.get_all(), feats[:37])

    stats.save(str(tmp_path / 'stats.npz'))
    loaded = metric_utils.FeatureStats.load(str(tmp_path / 'stats.npz'))
    assert loaded.num_items == 37 and loaded.is_full()
    np.testing.assert_array_equal(loaded.get_all(), feats[:37])
    np.testing.assert_array_equal(loaded.get_mean_cov()[1], cov)
    assert [p.name for p in tmp_path.iterdir()] == ['stats.npz']  # No temporary file left behind.


def test_stats_cache_key(tmp_path, monkeypatch):
    monkeypatch.setenv('GNGAN_CACHE_DIR', str(tmp_path / 'cache'))
    data = tmp_path / 'data.zip'
    data.write_bytes(b'x')
    kwargs = dict(class_name='training.data.dataset.ImageFolderDataset', path=str(data), xflip=False)
    key = lambda ds, det='http://a/inception.pt', stats=dict(capture_mean_cov=True, max_items=None): \
        metric_utils.stats_cache_file(ds, det, dict(return_features=True), stats)
    base = key(kwargs)
    assert base.startswith(str(tmp_path / 'cache' / 'metrics' / 'data-inception-'))
    assert key(dict(kwargs, use_labels=True)) == base  # Labels do not change the images.
    assert key(kwargs, det='http://a/other.pt') != base
    assert key(kwargs, stats=dict(capture_mean_cov=True, max_items=10)) != base
    assert key(dict(kwargs, xflip=True)) != base
    data.write_bytes(b'rebuilt dataset')  # A rebuilt dataset gets new statistics.
    assert key(kwargs) != base

#----------------------------------------------------------------------------
# Detectors.


class _ChannelMeans(torch.nn.Module):
    def forward(self, x: torch.Tensor, return_features: bool = False) -> torch.Tensor:
        assert x.dtype == torch.uint8
        return x.to(torch.float32).mean(dim=[2, 3])


def test_run_detector_repeats_grayscale():
    detector = torch.jit.script(_ChannelMeans())
    gray = torch.tensor([[[[0, 10], [20, 30]]]], dtype=torch.uint8)
    out = metric_utils.run_detector(detector, gray, dict(return_features=True))
    np.testing.assert_array_equal(out.numpy(), [[15.0, 15.0, 15.0]])


def test_unreachable_detector_gives_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv('GNGAN_CACHE_DIR', str(tmp_path))
    url = 'http://127.0.0.1:9/x.pt'
    with pytest.raises(metric_utils.DetectorUnavailableError) as info:
        metric_utils.get_feature_detector(url)
    message = str(info.value)
    assert '\n' not in message and url in message and '--detector=/path/to/x.pt' in message


def test_missing_or_broken_detector_file(tmp_path):
    with pytest.raises(metric_utils.DetectorUnavailableError, match='missing.pt'):
        metric_utils.get_feature_detector(str(tmp_path / 'missing.pt'))
    bogus = tmp_path / 'bogus.pt'
    bogus.write_bytes(b'not a TorchScript archive')
    with pytest.raises(metric_utils.DetectorUnavailableError, match='--detector=PATH_OR_URL'):
        metric_utils.get_feature_detector(str(bogus))


def write_png(path, image: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    PIL.Image.fromarray(image).save(str(path))


def test_folder_fingerprint_sees_every_file_in_every_sub_folder(tmp_path):
    # The layout dataset_tool writes (images in numbered sub-folders), one level deeper for good measure.
    rng = np.random.default_rng(9)
    root = tmp_path / 'data'
    names = ['00000/img00000000.png', '00000/img00000001.png', '00001/deep/img00000002.png']
    for name in names:
        write_png(root / name, rng.integers(0, 256, [8, 8, 3], dtype=np.uint8))
    base = metric_utils.dataset_fingerprint(str(root))
    assert metric_utils.dataset_fingerprint(str(root)) == base  # Stable while nothing changes.

    write_png(root / names[2], np.zeros([8, 8, 3], np.uint8))  # Blacked out in place, deep in a sub-folder.
    changed = metric_utils.dataset_fingerprint(str(root))
    assert changed != base
    os.rename(root / names[0], root / '00000/renamed.png')
    renamed = metric_utils.dataset_fingerprint(str(root))
    assert renamed not in (base, changed)
    write_png(root / '00002/img00000003.png', np.zeros([8, 8, 3], np.uint8))
    assert metric_utils.dataset_fingerprint(str(root)) not in (base, changed, renamed)


def test_zip_fingerprint_follows_content_not_file_times(tmp_path):
    def write_zip(path, images):
        with zipfile.ZipFile(path, 'w') as zf:
            for i, image in enumerate(images):
                buf = io.BytesIO()
                PIL.Image.fromarray(image).save(buf, format='png')
                zf.writestr(f'00000/img{i:08d}.png', buf.getvalue())
    images = list(np.random.default_rng(10).integers(0, 256, [3, 8, 8, 3], dtype=np.uint8))
    write_zip(tmp_path / 'a.zip', images)
    base = metric_utils.dataset_fingerprint(str(tmp_path / 'a.zip'))
    write_zip(tmp_path / 'b.zip', images)  # The same images archived again: same statistics.
    assert metric_utils.dataset_fingerprint(str(tmp_path / 'b.zip')) == base
    images[1] = images[1].copy()
    images[1][0, 0, 0] ^= 1  # One bit of one pixel.
    write_zip(tmp_path / 'a.zip', images)
    assert metric_utils.dataset_fingerprint(str(tmp_path / 'a.zip')) != base


def test_stats_cache_key_uses_dataset_content(tmp_path, monkeypatch):
    monkeypatch.setenv('GNGAN_CACHE_DIR', str(tmp_path / 'cache'))
    root = tmp_path / 'data'
    write_png(root / '00000' / 'img.png', np.full([8, 8, 3], 7, np.uint8))
    key = lambda: metric_utils.stats_cache_file(dict(class_name='training.data.dataset.ImageFolderDataset', path=str(root)),
                                                'http://a/inception.pt', dict(return_features=True), dict(max_items=None))
    base = key()
    assert os.path.basename(base).startswith('data-inception-')
    write_png(root / '00000' / 'img.png', np.zeros([8, 8, 3], np.uint8))
    assert key() != base


def test_vgg16_detector_message_names_its_own_option(tmp_path, monkeypatch):
    monkeypatch.setenv('GNGAN_CACHE_DIR', str(tmp_path))
    url = 'http://127.0.0.1:9/vgg16.pt'
    opts = metric_utils.MetricOptions(detector_url='http://127.0.0.1:9/inception.pt', pr_detector_url=url)
    assert opts.detector_option(url) == '--pr-detector' and opts.detector_option(opts.detector_url) == '--detector'
    assert metric_utils.MetricOptions().detector_option(metric_utils.VGG16_URL) == '--pr-detector'
    with pytest.raises(metric_utils.DetectorUnavailableError) as info:
        metric_utils.get_feature_detector(url, option=opts.detector_option(url))
    assert '--pr-detector=/path/to/vgg16.pt' in str(info.value) and '--detector=' not in str(info.value)
