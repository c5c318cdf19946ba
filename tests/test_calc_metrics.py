"""Tests of calc_metrics.py: a whole run on a snapshot and a dataset zip with a tiny TorchScript
detector, the dataset statistics cache, a 2-process gloo run, and the offline-detector message."""

import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import calc_metrics
import training.data.dataset
from metrics import features
from tests.support.stand_ins import make_detector, write_dataset_zip
from tests.support.detector_spy import assert_full_precision, spy_on_detectors
from tests.support.references import fid_reference
from tests.support.stand_ins import TinyGenerator, dataset_kwargs_of, features_of
from torch_utils import devices, persistence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A run folder holding a snapshot of a tiny G whose training set is a dataset zip, and a detector file."""
    monkeypatch.setenv('GNGAN_CACHE_DIR', str(tmp_path / 'cache'))
    data_path = str(tmp_path / 'data.zip')
    images = write_dataset_zip(data_path, num_images=20)
    run_dir = tmp_path / 'run'
    run_dir.mkdir()
    snapshot = str(run_dir / 'network-snapshot-000010.pkl')
    G = TinyGenerator()
    persistence.save_snapshot(snapshot, dict(G=TinyGenerator(), G_ema=G, training_set_kwargs=dict(dataset_kwargs_of(data_path), xflip=True)))
    detector_path = str(tmp_path / 'tiny-detector.pt')
    detector = make_detector(detector_path)
    return dict(tmp_path=tmp_path, run_dir=run_dir, snapshot=snapshot, data_path=data_path, images=images,
                detector_path=detector_path, detector=detector)


def invoke(run: dict, *extra: str, metrics: str = 'fid50k_full,is50k'):
    args = [f'--network={run["snapshot"]}', f'--metrics={metrics}', f'--detector={run["detector_path"]}', '--num-gen=30', *extra]
    return CliRunner().invoke(calc_metrics.main, args)


def read_jsonl(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def cache_files(run: dict, cache_dir: str = 'cache') -> list:
    return sorted((run['tmp_path'] / cache_dir / 'metrics').glob('*.npz'))


def test_run_writes_results_and_reuses_cached_statistics(run, monkeypatch):
    result = invoke(run)
    assert result.exit_code == 0, result.output
    fid_lines = read_jsonl(run['run_dir'] / 'metric-fid50k_full.jsonl')
    is_lines = read_jsonl(run['run_dir'] / 'metric-is50k.jsonl')
    assert len(fid_lines) == 1 and len(is_lines) == 1
    fid = fid_lines[0]['results']['fid50k_full']
    assert np.isfinite(fid) and fid_lines[0]['snapshot_pkl'] == 'network-snapshot-000010.pkl'
    assert fid_lines[0]['num_gen'] == 30 and fid_lines[0]['detector'] == run['detector_path']
    # The data compared with, as an absolute path, and the image counts.
    assert fid_lines[0]['data'] == os.path.abspath(run['data_path']) and fid_lines[0]['num_real'] == 20
    assert is_lines[0]['num_gen'] == 30 and 'data' not in is_lines[0]  # IS compares with no data.
    assert set(is_lines[0]['results']) == {'is50k_mean', 'is50k_std'}
    assert 'fid50k_full' in result.output and 'is50k_mean' in result.output  # The table.

    # The cached statistics are those of the training images, without x-flips although the snapshot's
    # training set had them (the paper protocol).
    [cache_file] = cache_files(run)
    mean, cov = features.FeatureStats.load(str(cache_file)).get_mean_cov()
    real = features_of(run['detector'], run['images'])
    np.testing.assert_allclose(mean, real.mean(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cov, np.cov(real, rowvar=False), rtol=1e-4, atol=1e-6)

    # Second run: the dataset must not even be opened, and the cache file stays as it was.
    mtime = os.stat(cache_file).st_mtime_ns
    def refuse(*args, **kwargs):
        raise AssertionError('the dataset was opened although its statistics are cached')
    monkeypatch.setattr(training.data.dataset.ImageFolderDataset, '__init__', refuse)
    result = invoke(run, metrics='fid50k_full')
    assert result.exit_code == 0, result.output
    assert 'Using cached dataset statistics' in result.output
    assert os.stat(cache_file).st_mtime_ns == mtime and cache_files(run) == [cache_file]
    fid_lines = read_jsonl(run['run_dir'] / 'metric-fid50k_full.jsonl')
    assert len(fid_lines) == 2 and fid_lines[1]['results']['fid50k_full'] == pytest.approx(fid, rel=1e-6)


def test_two_gloo_processes_match_one_process(run, monkeypatch):
    result = invoke(run, '--gpus=1', '--verbose=false', metrics='fid50k_full')
    assert result.exit_code == 0, result.output
    monkeypatch.setenv('GNGAN_CACHE_DIR', str(run['tmp_path'] / 'cache2'))
    # Data loader workers of spawned processes start slowly (each imports torch): none here.
    result = invoke(run, '--gpus=2', '--workers=0', '--verbose=false', metrics='fid50k_full')
    assert result.exit_code == 0, result.output

    [one], [two] = cache_files(run), cache_files(run, 'cache2')
    assert one.name == two.name
    stats_one, stats_two = features.FeatureStats.load(str(one)), features.FeatureStats.load(str(two))
    assert stats_one.num_items == stats_two.num_items == len(run['images'])
    for a, b in zip(stats_one.get_mean_cov(), stats_two.get_mean_cov()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
    lines = read_jsonl(run['run_dir'] / 'metric-fid50k_full.jsonl')
    assert [line['num_gpus'] for line in lines] == [1, 2]
    # The generated images do not depend on the number of processes either.
    assert lines[1]['results']['fid50k_full'] == pytest.approx(lines[0]['results']['fid50k_full'], rel=1e-5)


def test_unreachable_detector_gives_clear_message_and_exit_code(run):
    url = 'http://127.0.0.1:9/x.pt'
    # A fresh interpreter, as a user runs it; it imports the test module first so that the snapshot's
    # test-only generator class is on the allow-list.
    code = 'import tests.support.stand_ins, calc_metrics; calc_metrics.main()'
    proc = subprocess.run([sys.executable, '-c', code, f'--network={run["snapshot"]}', f'--detector={url}', '--num-gen=8'],
                          cwd=REPO_ROOT, capture_output=True, text=True, env=dict(os.environ), timeout=120)
    assert proc.returncode != 0
    assert 'Traceback' not in proc.stderr + proc.stdout
    error_lines = proc.stderr.strip().splitlines()
    assert len(error_lines) == 1, proc.stderr
    assert url in error_lines[0] and '--detector=/path/to/x.pt' in error_lines[0]
    assert proc.stdout.splitlines().count(f'Downloading {url} ...') == 1, proc.stdout  # Once, not once per attempt.
    assert not (run['run_dir'] / 'metric-fid50k_full.jsonl').exists()


def test_user_errors_are_one_line(run):
    result = invoke(run, metrics='fid5k')
    assert result.exit_code != 0 and 'invalid --metrics: fid5k' in result.output
    result = invoke(run, metrics='fid10k')
    assert result.exit_code == 1 and 'Error: this metric compares with a reference split' in result.output
    result = CliRunner().invoke(calc_metrics.main, [f'--network={run["tmp_path"] / "missing.pkl"}'])
    assert result.exit_code == 1 and 'cannot load --network' in result.output


def test_device_choice_is_checked_before_anything_loads(run, monkeypatch):
    """On a machine where torch sees one GPU (stubbed): --gpus beyond it, or an invisible --device, is one line."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 1)
    monkeypatch.setattr(calc_metrics.legacy, 'load_network', lambda *a: pytest.fail('loaded the network'))
    for extra, message in [(['--gpus=2', '--device=cuda'], 'Error: --gpus=2, but torch sees 1 CUDA GPU(s)'),
                           (['--device=cuda:1'], 'Error: --device: cuda:1 is not visible: torch sees 1 CUDA GPU(s)')]:
        result = invoke(run, *extra)
        assert result.exit_code == 1 and result.output.startswith(message) and len(result.output.splitlines()) == 1


def test_ref_stats_written_from_a_dataset_give_the_dataset_fid(run):
    npz = run['tmp_path'] / 'stats' / 'data.train.npz'
    result = CliRunner().invoke(calc_metrics.main, [f'--data={run["data_path"]}', f'--write-stats={npz}',
                                                    f'--detector={run["detector_path"]}'])
    assert result.exit_code == 0, result.output
    assert 'of 20 images' in result.output
    with np.load(npz) as stats:  # The authors' format: mu and sigma only.
        assert sorted(stats.files) == ['mu', 'sigma']
        real = features_of(run['detector'], run['images'])
        np.testing.assert_allclose(stats['mu'], real.mean(axis=0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(stats['sigma'], np.cov(real, rowvar=False), rtol=1e-4, atol=1e-6)

    assert invoke(run, f'--data={run["data_path"]}', metrics='fid50k_full').exit_code == 0
    result = invoke(run, f'--ref-stats={npz}', metrics='fid50k_full,fid10k')  # Any FID metric, even fid10k without --ref-data.
    assert result.exit_code == 0, result.output
    by_data, by_stats = read_jsonl(run['run_dir'] / 'metric-fid50k_full.jsonl')
    assert by_stats['results']['fid50k_full'] == pytest.approx(by_data['results']['fid50k_full'], rel=1e-9)
    assert by_stats['ref_stats'] == str(npz) and 'data' not in by_stats and 'num_real' not in by_stats
    [fid10k] = read_jsonl(run['run_dir'] / 'metric-fid10k.jsonl')
    assert fid10k['results']['fid10k'] == pytest.approx(by_data['results']['fid50k_full'], rel=1e-9)  # Same 30 images.

    bad = run['tmp_path'] / 'bad.npz'
    np.savez(bad, mu=np.zeros(3))
    result = invoke(run, f'--ref-stats={bad}', metrics='fid50k_full')
    assert result.exit_code == 1 and 'holds mu, not mu and sigma' in result.output
    result = invoke(run, f'--ref-stats={npz}', metrics='is50k')
    assert result.exit_code == 1 and 'give one in --metrics' in result.output
    wrong_dim = run['tmp_path'] / 'wrong.npz'
    np.savez(wrong_dim, mu=np.zeros(2048), sigma=np.eye(2048))
    result = invoke(run, f'--ref-stats={wrong_dim}', metrics='fid50k_full')
    assert result.exit_code == 1 and 'are 2048-dimensional, but the detector' in result.output
    assert len(result.output.strip().splitlines()[-1]) > 0 and 'Traceback' not in result.output


def test_features_at_full_precision_whatever_the_switches(run, tf32_on, monkeypatch):
    # TF32 allowed when calc_metrics.py starts (PyTorch's default for convolutions): off in every detector call, for
    # every metric and for --write-stats, and on again afterwards.
    seen = spy_on_detectors(monkeypatch)
    before = devices.read_switches()
    result = CliRunner().invoke(calc_metrics.main, [f'--data={run["data_path"]}', f'--detector={run["detector_path"]}',
                                                    f'--write-stats={run["tmp_path"] / "data.train.npz"}'])
    assert result.exit_code == 0, result.output
    assert seen and devices.read_switches() == before
    calls = len(seen)
    result = invoke(run, f'--pr-detector={run["detector_path"]}', metrics='fid50k_full,is50k,kid50k_full,pr50k3_full')
    assert result.exit_code == 0, result.output
    assert len(seen) > calls and devices.read_switches() == before
    assert_full_precision(seen)


def test_images_instead_of_a_network(run):
    # The dataset's own images, unzipped into a folder (sub-folders included): FID against the dataset is 0.
    folder = run['tmp_path'] / 'own-images'
    with zipfile.ZipFile(run['data_path']) as zf:
        zf.extractall(folder, [name for name in zf.namelist() if name.endswith('.png')])
    args = [f'--images={folder}', f'--data={run["data_path"]}', f'--detector={run["detector_path"]}']
    result = CliRunner().invoke(calc_metrics.main, [*args, '--metrics=fid50k_full', '--num-gen=20'])
    assert result.exit_code == 0, result.output
    line = json.loads([text for text in result.output.splitlines() if text.startswith('{')][0])
    assert abs(line['results']['fid50k_full']) < 1e-6
    assert line['images'] == str(folder) and line['num_gen'] == 20 and line['num_real'] == 20
    assert not list(run['tmp_path'].glob('**/metric-*.jsonl'))  # Printed, not written next to the images.

    # FID between two datasets, against an independent computation.
    other = str(run['tmp_path'] / 'other.zip')
    other_images = write_dataset_zip(other, num_images=12, seed=4)
    result = CliRunner().invoke(calc_metrics.main, [f'--images={other}', f'--data={run["data_path"]}',
                                                    f'--detector={run["detector_path"]}', '--metrics=fid10k_full',
                                                    '--num-gen=12'])
    assert result.exit_code == 0, result.output
    line = json.loads([text for text in result.output.splitlines() if text.startswith('{')][0])
    expected = fid_reference(features_of(run['detector'], other_images), features_of(run['detector'], run['images']))
    assert line['results']['fid10k_full'] == pytest.approx(expected, rel=1e-5)

    # A metric's number of images is part of its protocol: fewer images are refused.
    result = CliRunner().invoke(calc_metrics.main, [f'--images={other}', f'--data={run["data_path"]}',
                                                    f'--detector={run["detector_path"]}', '--metrics=fid10k_full'])
    assert result.exit_code == 1 and 'holds 12 images, but this metric evaluates 10000' in result.output


def test_data_that_does_not_fit_the_generator_is_one_line(run):
    big = str(run['tmp_path'] / 'big.zip')
    write_dataset_zip(big, num_images=4, resolution=32)
    result = invoke(run, f'--data={big}', metrics='fid50k_full')
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == (f'Error: the dataset {big} holds 32x32 RGB images, but the generator '
                                                      f'makes 8x8 RGB images: compare it with data of its own kind')


def test_failing_process_reason_is_shown(run):
    # Rank 1 of 2 reads images 10-19 (blocks of 10): a corrupt image 15 fails there, not in rank 0.
    broken = str(run['tmp_path'] / 'broken.zip')
    with zipfile.ZipFile(run['data_path']) as src, zipfile.ZipFile(broken, 'w') as dst:
        for name in src.namelist():
            dst.writestr(name, b'not a png' if name == '00000/img00000015.png' else src.read(name))
    code = 'import tests.support.stand_ins, calc_metrics; calc_metrics.main()'
    proc = subprocess.run([sys.executable, '-c', code, f'--network={run["snapshot"]}', f'--data={broken}', '--gpus=2',
                           '--workers=0', '--verbose=false', f'--detector={run["detector_path"]}', '--num-gen=8'],
                          cwd=REPO_ROOT, capture_output=True, text=True, env=dict(os.environ), timeout=300)
    assert proc.returncode == 1
    assert 'Traceback' not in proc.stderr + proc.stdout
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f'Error: cannot decode 00000/img00000015.png in dataset {broken}: ') and line.endswith(' (process 1)')


def test_modes_and_relative_snapshot_data(run, monkeypatch):
    result = CliRunner().invoke(calc_metrics.main, ['--metrics=is50k'])
    assert result.exit_code == 1 and 'give one of --network' in result.output
    result = CliRunner().invoke(calc_metrics.main, [f'--network={run["snapshot"]}', f'--images={run["data_path"]}'])
    assert result.exit_code == 1 and 'give one of --network' in result.output
    result = CliRunner().invoke(calc_metrics.main, [f'--write-stats={run["tmp_path"] / "x.npz"}'])
    assert result.exit_code == 1 and 'give the dataset' in result.output
    assert not (run['tmp_path'] / 'x.npz').exists()

    # A snapshot whose training set was recorded relative to where training ran, evaluated from elsewhere.
    monkeypatch.chdir(run['tmp_path'])
    snapshot = str(run['run_dir'] / 'relative.pkl')
    persistence.save_snapshot(snapshot, dict(G_ema=TinyGenerator(), training_set_kwargs=dataset_kwargs_of('data.zip')))
    monkeypatch.chdir(run['run_dir'])
    result = CliRunner().invoke(calc_metrics.main, [f'--network={snapshot}', '--metrics=fid50k_full'])
    assert result.exit_code == 1 and 'relative to where the training ran' in result.output and '--data' in result.output


def test_generator_option_scores_the_snapshots_G(run):
    # G and G_ema of the snapshot are different random maps: --generator=G gives G's FID, the default G_ema's.
    snapshot = persistence.load_snapshot(run['snapshot'])
    real = features_of(run['detector'], run['images'])
    for option, name in [((), 'G_ema'), (('--generator=G',), 'G')]:
        result = invoke(run, *option, metrics='fid50k_full')
        assert result.exit_code == 0, result.output
        with torch.no_grad():
            z = torch.from_numpy(np.random.default_rng([0, 0]).standard_normal([30, 4], dtype=np.float32))
            images = (snapshot[name](z, torch.zeros([30, 0])) * 127.5 + 128).clamp(0, 255).to(torch.uint8).numpy()
        line = read_jsonl(run['run_dir'] / 'metric-fid50k_full.jsonl')[-1]
        assert line['results']['fid50k_full'] == pytest.approx(fid_reference(features_of(run['detector'], images), real), rel=1e-4)
        assert line['generator'] == name
    result = CliRunner().invoke(calc_metrics.main, [f'--images={run["data_path"]}', '--generator=G'])
    assert result.exit_code == 1 and result.output.count('\n') == 1 and '--generator' in result.output


@persistence.persistent_class
class BatchNormGenerator(torch.nn.Module):
    """Every pixel of image i is 1.5 * BatchNorm(z_i[0]) (no affine; running mean 0.5, variance 4 in eval mode)."""
    z_dim, c_dim, img_resolution, img_channels = 2, 0, 8, 3

    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(1, affine=False)
        self.bn.running_mean.fill_(0.5)
        self.bn.running_var.fill_(4.0)

    def forward(self, z: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return (1.5 * self.bn(z[:, :1])).reshape(-1, 1, 1, 1).expand(-1, 3, 8, 8)


@persistence.persistent_class
class HalfSquaredNormDiscriminator(torch.nn.Module):
    """f(x) = ||x||^2 / 2: ||grad_x f|| = ||x||."""
    c_dim, img_resolution, img_channels = 0, 8, 3

    def __init__(self):
        super().__init__()
        self.unused = torch.nn.Parameter(torch.zeros([]))

    def forward(self, img: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return img.square().sum(dim=[1, 2, 3])[:, None] / 2 + 0 * self.unused


def test_l_d_scores_a_batchnorm_generator_in_training_mode_on_bn_batch_images(run):
    """calc_metrics.py --metrics=lipschitz1k --bn-batch=4: G in training mode on blocks of 4 latents (block b's from
    the metric's RNG seeded with (0, b)), so each fake is 1.5 * its block's standardized z[0] (biased variance, eps
    1e-5) everywhere, and L_D = max ||x|| over the 20 reals and 8 fakes, computed here in numpy."""
    snapshot = str(run['tmp_path'] / 'bn' / 'network-snapshot-000001.pkl')
    os.makedirs(os.path.dirname(snapshot))
    persistence.save_snapshot(snapshot, dict(G=BatchNormGenerator(), G_ema=BatchNormGenerator(),
                                             D=HalfSquaredNormDiscriminator(), experiment=dict(norm='none'),
                                             training_set_kwargs=dataset_kwargs_of(run['data_path'])))
    result = CliRunner().invoke(calc_metrics.main, [f'--network={snapshot}', '--metrics=lipschitz1k', '--num-gen=8',
                                                    '--bn-batch=4', '--verbose=false'])
    assert result.exit_code == 0, result.output
    [line] = read_jsonl(run['tmp_path'] / 'bn' / 'metric-lipschitz1k.jsonl')
    reals = run['images'].astype(np.float64) / 127.5 - 1
    fakes = []
    for block in range(2):
        z0 = np.random.default_rng([0, block]).standard_normal([4, 2], dtype=np.float32)[:, 0].astype(np.float64)
        fakes.append(1.5 * (z0 - z0.mean()) / np.sqrt(z0.var() + 1e-5))
    fake_norms = np.abs(np.concatenate(fakes)) * np.sqrt(3 * 8 * 8)
    expected = max(np.sqrt((reals ** 2).sum(axis=(1, 2, 3))).max(), fake_norms.max())
    assert fake_norms.max() > np.sqrt((reals ** 2).sum(axis=(1, 2, 3))).max()  # It lies on a fake.
    assert line['results']['lipschitz1k'] == pytest.approx(expected, rel=1e-5)
