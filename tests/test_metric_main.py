"""Tests of metrics/metric_main.py: the registry, calc_metric end to end on tiny data with a tiny
TorchScript detector (against independent numpy/scipy computations), and report_metric.
"""

import inspect
import json
import os

import numpy as np
import PIL.Image
import pytest
import torch

from metrics import features, metric_main
from tests.support.detector_spy import assert_full_precision, spy_on_detectors
from tests.support.references import fid_reference, fraction_in_manifold_by_loops
from tests.support.stand_ins import TinyGenerator, dataset_kwargs_of, features_of, make_detector, write_dataset_zip
from torch_utils import devices, persistence

#----------------------------------------------------------------------------
# Helpers.


@persistence.persistent_class
class ConstantGenerator(torch.nn.Module):
    """Ignores z: every image is the constant `values[k]` for class k (values[0] when unconditional)."""

    def __init__(self,
        values: list = (0.25,),     # Pixel value in [-1, 1] per class.
        z_dim: int = 3,             # Latent size (unused).
        c_dim: int = 0,             # Number of classes, 0 = unconditional.
        img_resolution: int = 8,    # Output resolution.
        img_channels: int = 3,      # Output channels.
    ):
        super().__init__()
        self.z_dim, self.c_dim, self.img_resolution, self.img_channels = z_dim, c_dim, img_resolution, img_channels
        self.register_buffer('values', torch.tensor(values, dtype=torch.float32))

    def forward(self, z: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        value = self.values[c.argmax(dim=1)] if self.c_dim > 0 else self.values[0].expand(len(z))
        return value.reshape(-1, 1, 1, 1).expand(-1, self.img_channels, self.img_resolution, self.img_resolution)


@pytest.fixture
def setup(tmp_path, monkeypatch):
    monkeypatch.setenv('GNGAN_CACHE_DIR', str(tmp_path / 'cache'))
    detector_path = str(tmp_path / 'tiny-detector.pt')
    detector = make_detector(detector_path)
    data_path = str(tmp_path / 'data.zip')
    images = write_dataset_zip(data_path)
    return dict(tmp_path=tmp_path, detector_path=detector_path, detector=detector, data_path=data_path, images=images)

#----------------------------------------------------------------------------
# Registry.


# Every protocol's built-in sizes and reference set, as the paper (Table 2's FIDs: 50k generated against the
# training set, 10k against the CIFAR-10 test split; IS on 50k in 10 splits) and StyleGAN2-ADA's metric_main define
# them: (function, its arguments but `opts`, defaults filled in). max_real None = the whole set.
PROTOCOLS = {
    'fid50k_full': ('compute_fid', dict(num_gen=50000, max_real=None, use_ref_data=False)),
    'fid30k_full': ('compute_fid', dict(num_gen=30000, max_real=None, use_ref_data=False)),
    'fid10k_full': ('compute_fid', dict(num_gen=10000, max_real=None, use_ref_data=False)),
    'fid50k':      ('compute_fid', dict(num_gen=50000, max_real=None, use_ref_data=True)),
    'fid10k':      ('compute_fid', dict(num_gen=10000, max_real=None, use_ref_data=True)),
    'fid3k':       ('compute_fid', dict(num_gen=3000, max_real=None, use_ref_data=True)),
    'is50k':       ('compute_is', dict(num_gen=50000, num_splits=10)),
    'kid50k_full': ('compute_kid', dict(max_real=1000000, num_gen=50000, num_subsets=100, max_subset_size=1000)),
    'pr50k3_full': ('compute_pr', dict(max_real=200000, num_gen=50000, nhood_size=3, batch_size=4096)),
    'lipschitz1k': ('compute_lipschitz', dict(num=1000)),
    'lipschitz50k': ('compute_lipschitz', dict(num=50000)),
}


def test_registry_holds_each_protocols_sizes_and_reference_set(monkeypatch):
    """Each registered metric calls its computation with the protocol's image counts and reference set (the
    computations replaced by recorders: nothing is generated)."""
    from metrics import (frechet_inception_distance, inception_score, kernel_inception_distance, lipschitz,
                         precision_recall)
    calls = []
    for module in [frechet_inception_distance, inception_score, kernel_inception_distance, lipschitz, precision_recall]:
        for name in ['compute_fid', 'compute_is', 'compute_kid', 'compute_pr', 'compute_lipschitz']:
            if hasattr(module, name):
                signature = inspect.signature(getattr(module, name))

                def record(*args, name=name, signature=signature, **kwargs):
                    bound = signature.bind(*args, **kwargs)
                    bound.apply_defaults()
                    assert bound.arguments.pop('opts') == 'opts'
                    calls.append((name, dict(bound.arguments)))
                    return (1.0, 0.0) if name in ('compute_is', 'compute_pr') else 1.0
                monkeypatch.setattr(module, name, record)
    assert sorted(metric_main.list_valid_metrics()) == sorted(PROTOCOLS)
    for metric, protocol in PROTOCOLS.items():
        calls.clear()
        metric_main._metric_dict[metric]('opts')  # pylint: disable=protected-access
        assert calls == [protocol], metric
    assert not metric_main.is_valid_metric('fid5k')


def test_unknown_metric_and_missing_reference_split(setup):
    G = ConstantGenerator()
    with pytest.raises(ValueError, match='unknown metric'):
        metric_main.calc_metric('fid5k', G=G, dataset_kwargs=dataset_kwargs_of(setup['data_path']))
    with pytest.raises(ValueError, match='--ref-data'):
        metric_main.calc_metric('fid10k', G=G, dataset_kwargs=dataset_kwargs_of(setup['data_path']),
                                detector_url=setup['detector_path'], num_gen=4)

#----------------------------------------------------------------------------
# calc_metric end to end, against independent computations.


def expected_constant_image(value: float, resolution: int = 8) -> np.ndarray:
    level = np.uint8(np.clip(np.floor(value * 127.5 + 127.5 + 0.5), 0, 255))
    return np.full([1, 3, resolution, resolution], level, dtype=np.uint8)


def test_fid_of_constant_generator(setup):
    # All generated images are one image g: mu_gen = f(g), sigma_gen = 0, so FID = |f(g) - mu|^2 + tr(sigma).
    G = ConstantGenerator(values=[0.25])
    result = metric_main.calc_metric('fid50k_full', G=G, dataset_kwargs=dataset_kwargs_of(setup['data_path']),
                                     detector_url=setup['detector_path'], num_gen=20)
    real = features_of(setup['detector'], setup['images'])
    gen = features_of(setup['detector'], expected_constant_image(0.25))[0]
    expected = np.sum((gen - real.mean(axis=0)) ** 2) + np.trace(np.cov(real, rowvar=False))
    assert result.results.fid50k_full == pytest.approx(expected, rel=1e-5)
    assert result.metric == 'fid50k_full' and result.num_gen == 20 and result.num_gpus == 1


def test_fid3k_is_3000_generated_images_against_the_reference_split(setup):
    # The authors' CelebA-HQ 128 protocol: 3k generated images against the held-out last 3k (here a 10-image split).
    ref_path = str(setup['tmp_path'] / 'ref3k.zip')
    ref_images = write_dataset_zip(ref_path, num_images=10, seed=2)
    result = metric_main.calc_metric('fid3k', G=ConstantGenerator(values=[-0.5]), dataset_kwargs={},
                                     ref_dataset_kwargs=dataset_kwargs_of(ref_path), detector_url=setup['detector_path'])
    real = features_of(setup['detector'], ref_images)
    gen = features_of(setup['detector'], expected_constant_image(-0.5))[0]
    expected = np.sum((gen - real.mean(axis=0)) ** 2) + np.trace(np.cov(real, rowvar=False))
    assert result.results.fid3k == pytest.approx(expected, rel=1e-5)
    assert result.num_gen == 3000 and result.ref_data == os.path.abspath(ref_path)


class BatchNormGenerator(torch.nn.Module):
    """Every pixel of image i is 0.3 * BatchNorm(z_i[0]) (no affine): in training mode normalized by its batch's
    statistics, in eval mode by the running ones (mean 0.5, variance 4)."""

    def __init__(self):
        super().__init__()
        self.z_dim, self.c_dim, self.img_resolution, self.img_channels = 2, 0, 8, 3
        self.bn = torch.nn.BatchNorm1d(1, affine=False)
        self.bn.running_mean.fill_(0.5)
        self.bn.running_var.fill_(4.0)

    def forward(self, z: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return (0.3 * self.bn(z[:, :1])).reshape(-1, 1, 1, 1).expand(-1, 3, 8, 8)


@pytest.mark.parametrize('bn_batch', [None, 4])
def test_bn_batch_scores_batchnorm_in_training_mode_on_batches_of_n(setup, bn_batch):
    # The authors' evaluation (bn_batch=N): G in training mode on N images at a time. Block b's latents are
    # numpy's standard normals seeded with (0, b), b = 0, 1, ...; with N = 4 and 8 images, two blocks of 4.
    G = BatchNormGenerator().eval()
    result = metric_main.calc_metric('fid50k_full', G=G, dataset_kwargs=dataset_kwargs_of(setup['data_path']),
                                     detector_url=setup['detector_path'], num_gen=8, bn_batch=bn_batch, generator='G')
    block_size = 4 if bn_batch else 8  # Without bn_batch: one block of min(64, 8) latents.
    z0 = np.concatenate([np.random.default_rng([0, b]).standard_normal([block_size, 2], dtype=np.float32)[:, 0]
                         for b in range(8 // block_size)]).astype(np.float64)
    if bn_batch:
        blocks = z0.reshape(-1, bn_batch)
        x = ((blocks - blocks.mean(axis=1, keepdims=True)) / np.sqrt(blocks.var(axis=1, keepdims=True) + 1e-5)).ravel()
    else:
        x = (z0 - 0.5) / np.sqrt(4 + 1e-5)
    levels = np.clip(np.floor(0.3 * x * 127.5 + 128), 0, 255).astype(np.uint8)
    images = np.broadcast_to(levels.reshape(-1, 1, 1, 1), [8, 3, 8, 8]).copy()
    expected = fid_reference(features_of(setup['detector'], images), features_of(setup['detector'], setup['images']))
    assert result.results.fid50k_full == pytest.approx(expected, rel=1e-4)
    assert result.get('bn_batch') == bn_batch and result.generator == 'G'
    assert float(G.bn.running_mean) == 0.5 and not G.training  # The caller's G is left as it was.


def test_fid_against_reference_split_with_mirror(setup):
    ref_path = str(setup['tmp_path'] / 'ref.zip')
    ref_images = write_dataset_zip(ref_path, num_images=10, seed=1)
    G = TinyGenerator()
    result = metric_main.calc_metric('fid10k', G=G, dataset_kwargs={}, ref_dataset_kwargs=dataset_kwargs_of(ref_path),
                                     detector_url=setup['detector_path'], num_gen=30, mirror=True)
    # Only the reference statistics are checked here: with mirror, the 10 images and their mirror images.
    cache_files = list((setup['tmp_path'] / 'cache' / 'metrics').glob('ref-tiny-detector-*.npz'))
    assert len(cache_files) == 1
    mean, cov = features.FeatureStats.load(str(cache_files[0])).get_mean_cov()
    real = features_of(setup['detector'], np.concatenate([ref_images, ref_images[:, :, :, ::-1].copy()]))
    np.testing.assert_allclose(mean, real.mean(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cov, np.cov(real, rowvar=False), rtol=1e-4, atol=1e-6)
    assert np.isfinite(result.results.fid10k) and result.mirror is True


def test_conditional_generator_uses_dataset_labels(setup):
    # Every training label is class 1 (of 2), so every generated image is class 1's constant.
    data_path = str(setup['tmp_path'] / 'labeled.zip')
    images = write_dataset_zip(data_path, num_images=12, labels=[1] * 12, seed=2)
    G = ConstantGenerator(values=[-0.5, 0.75], c_dim=2)
    result = metric_main.calc_metric('fid10k_full', G=G, dataset_kwargs=dataset_kwargs_of(data_path),
                                     detector_url=setup['detector_path'], num_gen=9)
    real = features_of(setup['detector'], images)
    gen = features_of(setup['detector'], expected_constant_image(0.75))[0]
    expected = np.sum((gen - real.mean(axis=0)) ** 2) + np.trace(np.cov(real, rowvar=False))
    assert result.results.fid10k_full == pytest.approx(expected, rel=1e-5)

    with pytest.raises(ValueError, match='conditional on 3 classes'):
        metric_main.calc_metric('fid10k_full', G=ConstantGenerator(values=[0, 0, 0], c_dim=3),
                                dataset_kwargs=dataset_kwargs_of(data_path), detector_url=setup['detector_path'], num_gen=9)


def test_inception_score_kid_and_pr_run_end_to_end(setup):
    # A generator whose images are all alike has IS exactly 1; KID and PR of a random G are finite and in range.
    kwargs = dict(dataset_kwargs=dataset_kwargs_of(setup['data_path']), detector_url=setup['detector_path'],
                  pr_detector_url=setup['detector_path'])
    is_result = metric_main.calc_metric('is50k', G=ConstantGenerator(), num_gen=20, **kwargs)
    assert is_result.results.is50k_mean == pytest.approx(1, abs=1e-6)
    assert is_result.results.is50k_std == pytest.approx(0, abs=1e-6)
    kid = metric_main.calc_metric('kid50k_full', G=TinyGenerator(), num_gen=16, **kwargs).results.kid50k_full
    assert np.isfinite(kid)
    pr = metric_main.calc_metric('pr50k3_full', G=TinyGenerator(), num_gen=16, **kwargs).results
    assert 0 <= pr.pr50k3_full_precision <= 1 and 0 <= pr.pr50k3_full_recall <= 1

def test_every_metric_runs_with_tf32_off_and_restores_the_switches(setup, tf32_on, monkeypatch):
    # TF32 allowed by the caller (a --precision=tf32 run, PyTorch's default for convolutions): every detector call
    # and every G call inside each metric sees it off; afterwards it is on again.
    seen_by_detectors = spy_on_detectors(monkeypatch)
    seen_by_G = []
    G = TinyGenerator()
    G.register_forward_pre_hook(lambda *args: seen_by_G.append(devices.read_switches()))
    before = devices.read_switches()
    kwargs = dict(dataset_kwargs=dataset_kwargs_of(setup['data_path']), detector_url=setup['detector_path'],
                  pr_detector_url=setup['detector_path'], num_gen=16, cache=False)
    for metric in ['fid50k_full', 'is50k', 'kid50k_full', 'pr50k3_full']:
        calls = len(seen_by_detectors)
        metric_main.calc_metric(metric, G=G, **kwargs)
        assert len(seen_by_detectors) > calls, metric
        assert devices.read_switches() == before
    assert_full_precision(seen_by_detectors)
    assert_full_precision(seen_by_G)

#----------------------------------------------------------------------------
# report_metric.


def test_report_metric_appends_json_lines(tmp_path):
    snapshot = tmp_path / 'network-snapshot-000100.pkl'
    snapshot.write_bytes(b'')
    result = dict(results=dict(fid50k_full=12.5), metric='fid50k_full', total_time=3.0, total_time_str='3s', num_gpus=1)
    path = metric_main.report_metric(result, snapshot_pkl=str(snapshot))
    assert path == str(tmp_path / 'metric-fid50k_full.jsonl')
    metric_main.report_metric(dict(result, results=dict(fid50k_full=11.0)), run_dir=str(tmp_path), snapshot_pkl=str(snapshot))
    lines = [json.loads(line) for line in open(path)]
    assert [line['results']['fid50k_full'] for line in lines] == [12.5, 11.0]
    assert lines[0]['snapshot_pkl'] == 'network-snapshot-000100.pkl' and 'timestamp' in lines[0]
    assert metric_main.report_metric(result) is None
    assert sorted(os.listdir(tmp_path)) == ['metric-fid50k_full.jsonl', 'network-snapshot-000100.pkl']

#----------------------------------------------------------------------------
# Dataset statistics cache, detectors, data that does not fit G, best metric.


def test_folder_dataset_statistics_recomputed_when_an_image_deep_inside_changes(setup):
    # A folder in dataset_tool's layout, images in sub-folders; FID of a constant G against it is
    # |f(g) - mu|^2 + tr(sigma) of the folder's current images.
    rng = np.random.default_rng(11)
    root = setup['tmp_path'] / 'folder'
    images = rng.integers(0, 256, size=[12, 3, 8, 8], dtype=np.uint8)
    paths = [root / f'{i // 4:05d}' / 'sub' / f'img{i:08d}.png' for i in range(12)]
    for path, image in zip(paths, images):
        path.parent.mkdir(parents=True, exist_ok=True)
        PIL.Image.fromarray(image.transpose(1, 2, 0)).save(str(path))

    def fid_and_log():
        log = []
        result = metric_main.calc_metric('fid50k_full', G=ConstantGenerator(values=[0.25]),
                                         dataset_kwargs=dataset_kwargs_of(str(root)), detector_url=setup['detector_path'],
                                         num_gen=10, progress=log.append)
        return result.results.fid50k_full, ' '.join(log)

    def expected(images):
        real = features_of(setup['detector'], images)
        gen = features_of(setup['detector'], expected_constant_image(0.25))[0]
        return np.sum((gen - real.mean(axis=0)) ** 2) + np.trace(np.cov(real, rowvar=False))

    fid, log = fid_and_log()
    assert fid == pytest.approx(expected(images), rel=1e-5) and 'Using cached' not in log
    fid_cached, log = fid_and_log()
    assert 'Using cached' in log and fid_cached == pytest.approx(fid, rel=1e-9)

    images[9] = 0  # Black out one image in place, deep in the last sub-folder.
    PIL.Image.fromarray(images[9].transpose(1, 2, 0)).save(str(paths[9]))
    fid_new, log = fid_and_log()
    assert 'Using cached' not in log
    assert fid_new == pytest.approx(expected(images), rel=1e-5) and fid_new != pytest.approx(fid, rel=1e-3)


def test_each_feature_network_has_its_own_detector(setup):
    # Inception stand-in A for FID, VGG16 stand-in B for precision/recall; the generated side is a zip
    # of images (calc_metric's `images_kwargs`), so the expected values follow from the features directly.
    vgg_path = str(setup['tmp_path'] / 'tiny-vgg.pt')
    vgg = make_detector(vgg_path, seed=5)
    gen_path = str(setup['tmp_path'] / 'gen.zip')
    gen_images = write_dataset_zip(gen_path, num_images=16, seed=3)
    kwargs = dict(dataset_kwargs=dataset_kwargs_of(setup['data_path']), images_kwargs=dataset_kwargs_of(gen_path),
                  detector_url=setup['detector_path'], pr_detector_url=vgg_path, num_gen=16)

    fid = metric_main.calc_metric('fid50k_full', **kwargs)
    assert fid.results.fid50k_full == pytest.approx(fid_reference(features_of(setup['detector'], gen_images),
                                                                  features_of(setup['detector'], setup['images'])), rel=1e-5)
    assert fid.detector == setup['detector_path'] and 'pr_detector' not in fid

    pr = metric_main.calc_metric('pr50k3_full', **kwargs)
    real_vgg, gen_vgg = features_of(vgg, setup['images']), features_of(vgg, gen_images)
    expected = (fraction_in_manifold_by_loops(real_vgg, gen_vgg, 3), fraction_in_manifold_by_loops(gen_vgg, real_vgg, 3))
    assert (pr.results.pr50k3_full_precision, pr.results.pr50k3_full_recall) == pytest.approx(expected, abs=1e-12)
    assert pr.pr_detector == vgg_path and 'detector' not in pr
    # With Inception's features the numbers differ: the test tells the detectors apart.
    real_inc, gen_inc = features_of(setup['detector'], setup['images']), features_of(setup['detector'], gen_images)
    assert (fraction_in_manifold_by_loops(real_inc, gen_inc, 3), fraction_in_manifold_by_loops(gen_inc, real_inc, 3)) != expected


def test_data_that_does_not_fit_the_generator_is_refused(setup):
    big = str(setup['tmp_path'] / 'big.zip')
    write_dataset_zip(big, num_images=4, resolution=16)
    kwargs = dict(detector_url=setup['detector_path'], num_gen=4)
    with pytest.raises(ValueError, match='holds 16x16 RGB images, but the generator makes 8x8 RGB images'):
        metric_main.calc_metric('fid50k_full', G=TinyGenerator(), dataset_kwargs=dataset_kwargs_of(big), **kwargs)
    with pytest.raises(ValueError, match='holds 8x8 RGB images, but the generator makes 8x8 grayscale images'):
        metric_main.calc_metric('kid50k_full', G=TinyGenerator(img_channels=1),
                                dataset_kwargs=dataset_kwargs_of(setup['data_path']), **kwargs)
    # Also when the dataset's statistics come from the cache (computed for another, fitting generator).
    metric_main.calc_metric('fid50k_full', G=TinyGenerator(img_resolution=16), dataset_kwargs=dataset_kwargs_of(big), **kwargs)
    with pytest.raises(ValueError, match='holds 16x16 RGB images'):
        metric_main.calc_metric('fid50k_full', G=TinyGenerator(), dataset_kwargs=dataset_kwargs_of(big), **kwargs)


def test_check_metrics_picks_the_best_metric_and_refuses_what_cannot_be_evaluated():
    check = lambda metrics, best=None, has_reference=False: metric_main.check_metrics(tuple(metrics), best, has_reference)
    assert check(['is50k', 'fid10k', 'fid50k_full'], has_reference=True) == 'fid10k'
    assert check(['is50k', 'kid50k_full']) is None
    assert check([]) is None
    assert check(['fid10k', 'fid50k_full'], 'fid50k_full', has_reference=True) == 'fid50k_full'
    with pytest.raises(ValueError, match='is not evaluated'):
        check(['fid10k'], 'fid50k_full', has_reference=True)
    with pytest.raises(ValueError, match='decided by a FID metric'):
        check(['is50k', 'fid10k'], 'is50k', has_reference=True)
    with pytest.raises(ValueError, match='decided by a FID metric'):
        check(['fid10k'], 'fid5k', has_reference=True)
    with pytest.raises(ValueError, match='give it with --ref-data or --ref-stats'):
        check(['is50k', 'fid10k'])
    with pytest.raises(ValueError, match='^--metrics: unknown fid1, is5k; valid: fid50k_full, '):
        check(['fid1', 'is50k', 'is5k'])
