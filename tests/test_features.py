"""Tests of metrics/features.py: the feature statistics, the statistics cache key and the dataset fingerprint."""

import io
import os
import zipfile

import numpy as np
import PIL.Image
import torch

from metrics import detectors, features


def test_feature_stats_mean_cov_truncation_and_round_trip(tmp_path):
    rng = np.random.default_rng(8)
    feats = rng.standard_normal([50, 6]).astype(np.float32) * 3 + 1
    stats = features.FeatureStats(capture_all=True, capture_mean_cov=True, max_items=37)
    for batch in np.split(feats, [8, 16, 30, 45]):
        stats.append(torch.from_numpy(batch))
    assert stats.is_full() and stats.num_items == 37
    mean, cov = stats.get_mean_cov()
    np.testing.assert_allclose(mean, feats[:37].astype(np.float64).mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(cov, np.cov(feats[:37].astype(np.float64), rowvar=False), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(stats.get_all(), feats[:37])

    stats.save(str(tmp_path / 'stats.npz'))
    loaded = features.FeatureStats.load(str(tmp_path / 'stats.npz'))
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
        features.stats_cache_file(ds, det, dict(return_features=True), stats)
    base = key(kwargs)
    assert base.startswith(str(tmp_path / 'cache' / 'metrics' / 'data-inception-'))
    assert key(dict(kwargs, use_labels=True)) == base  # Labels do not change the images.
    assert key(kwargs, det='http://a/other.pt') != base
    assert key(kwargs, stats=dict(capture_mean_cov=True, max_items=10)) != base
    assert key(dict(kwargs, xflip=True)) != base
    # A snapshot written before training/ had sub-packages names the same class by its old module.
    assert key(dict(kwargs, class_name='training.dataset.ImageFolderDataset')) == base
    # Features of other arithmetic (statistics cached before detector calls ran at full float32 precision).
    monkeypatch.setattr(detectors, 'ARITHMETIC', 'float32, TF32 allowed')
    assert key(kwargs) != base
    monkeypatch.undo()
    monkeypatch.setenv('GNGAN_CACHE_DIR', str(tmp_path / 'cache'))
    assert key(kwargs) == base
    data.write_bytes(b'rebuilt dataset')  # A rebuilt dataset gets new statistics.
    assert key(kwargs) != base


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
    base = features.dataset_fingerprint(str(root))
    assert features.dataset_fingerprint(str(root)) == base  # Stable while nothing changes.

    write_png(root / names[2], np.zeros([8, 8, 3], np.uint8))  # Blacked out in place, deep in a sub-folder.
    changed = features.dataset_fingerprint(str(root))
    assert changed != base
    os.rename(root / names[0], root / '00000/renamed.png')
    renamed = features.dataset_fingerprint(str(root))
    assert renamed not in (base, changed)
    write_png(root / '00002/img00000003.png', np.zeros([8, 8, 3], np.uint8))
    assert features.dataset_fingerprint(str(root)) not in (base, changed, renamed)


def test_zip_fingerprint_follows_content_not_file_times(tmp_path):
    def write_zip(path, images):
        with zipfile.ZipFile(path, 'w') as zf:
            for i, image in enumerate(images):
                buf = io.BytesIO()
                PIL.Image.fromarray(image).save(buf, format='png')
                zf.writestr(f'00000/img{i:08d}.png', buf.getvalue())
    images = list(np.random.default_rng(10).integers(0, 256, [3, 8, 8, 3], dtype=np.uint8))
    write_zip(tmp_path / 'a.zip', images)
    base = features.dataset_fingerprint(str(tmp_path / 'a.zip'))
    write_zip(tmp_path / 'b.zip', images)  # The same images archived again: same statistics.
    assert features.dataset_fingerprint(str(tmp_path / 'b.zip')) == base
    images[1] = images[1].copy()
    images[1][0, 0, 0] ^= 1  # One bit of one pixel.
    write_zip(tmp_path / 'a.zip', images)
    assert features.dataset_fingerprint(str(tmp_path / 'a.zip')) != base


def test_stats_cache_key_uses_dataset_content(tmp_path, monkeypatch):
    monkeypatch.setenv('GNGAN_CACHE_DIR', str(tmp_path / 'cache'))
    root = tmp_path / 'data'
    write_png(root / '00000' / 'img.png', np.full([8, 8, 3], 7, np.uint8))
    key = lambda: features.stats_cache_file(dict(class_name='training.data.dataset.ImageFolderDataset', path=str(root)),
                                            'http://a/inception.pt', dict(return_features=True), dict(max_items=None))
    base = key()
    assert os.path.basename(base).startswith('data-inception-')
    write_png(root / '00000' / 'img.png', np.zeros([8, 8, 3], np.uint8))
    assert key() != base
