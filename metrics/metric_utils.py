"""Machinery shared by the metrics.

* The math of each metric as a plain function of statistics or features (`fid_from_stats`,
  `is_from_probs`, `kid_from_features`, `precision_recall_from_features`).
* Feature detectors: TorchScript networks fetched with `dnnlib.util.open_url` and its download cache,
  read only after torch_utils/bounded_read.py's archive check.
* `FeatureStats`: detector outputs collected batch by batch (all of them, or the sums behind their mean
  and covariance), gathered across processes, and saved to / loaded from the statistics cache.
* Feature extraction over a dataset (cached) and over a generator or a folder/zip of images standing
  in for one, split across processes.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import time
import urllib.parse
import warnings
import zipfile
from typing import Any, BinaryIO, Callable

import numpy as np
import scipy.linalg
import scipy.special
import torch

import dnnlib
from torch_utils import bounded_read

# Inception-v3 of the official TensorFlow FID and IS code (inception-2015-12-05.tgz), as exported to
# TorchScript by StyleGAN2-ADA.
INCEPTION_URL = 'https://nvlabs-fi-cdn.nvidia.com/stylegan2-ada-pytorch/pretrained/metrics/inception-2015-12-05.pt'

# VGG16 of the precision/recall paper (Kynkaanniemi et al. 2019), as exported to TorchScript by StyleGAN2-ADA.
VGG16_URL = 'https://nvlabs-fi-cdn.nvidia.com/stylegan2-ada-pytorch/pretrained/metrics/vgg16.pt'

# Largest imaginary part allowed on the diagonal of sqrtm(sigma_a sigma_b): the official FID code's tolerance.
_FID_MAX_IMAG = 1e-3

_PROGRESS_INTERVAL_S = 30  # At most one progress line per this many seconds within a stage.

#----------------------------------------------------------------------------
# The math, as plain functions.


def fid_from_stats(mu_a: np.ndarray, sigma_a: np.ndarray, mu_b: np.ndarray, sigma_b: np.ndarray,
                   eps: float = 1e-6) -> float:
    """Frechet distance between the Gaussians N(mu_a, sigma_a) and N(mu_b, sigma_b):

        d^2 = ||mu_a - mu_b||^2 + tr(sigma_a) + tr(sigma_b) - 2 tr((sigma_a sigma_b)^(1/2))

    computed in float64 the way the official implementation (TTUR) does it: the matrix square root is
    scipy's Schur-method sqrtm; if it comes out non-finite because the product is (nearly) singular,
    it is recomputed with `eps` added to both diagonals; imaginary parts left by round-off are dropped,
    and a large one (the inputs are not covariance matrices) raises ValueError.
    """
    mu_a, mu_b = np.atleast_1d(np.asarray(mu_a, np.float64)), np.atleast_1d(np.asarray(mu_b, np.float64))
    sigma_a, sigma_b = np.atleast_2d(np.asarray(sigma_a, np.float64)), np.atleast_2d(np.asarray(sigma_b, np.float64))
    if mu_a.shape != mu_b.shape or sigma_a.shape != sigma_b.shape or sigma_a.shape != mu_a.shape * 2:
        raise ValueError(f'FID: mismatched statistics: means {mu_a.shape} and {mu_b.shape}, '
                         f'covariances {sigma_a.shape} and {sigma_b.shape}')

    with warnings.catch_warnings():
        warnings.simplefilter('ignore', scipy.linalg.LinAlgWarning)  # Singular products are handled below.
        covmean = scipy.linalg.sqrtm(sigma_a @ sigma_b)
        if not np.isfinite(covmean).all():
            offset = np.eye(sigma_a.shape[0]) * eps
            covmean = scipy.linalg.sqrtm((sigma_a + offset) @ (sigma_b + offset))
    if np.iscomplexobj(covmean):
        max_imag = np.abs(np.diagonal(covmean).imag).max()
        if max_imag > _FID_MAX_IMAG:
            raise ValueError(f'FID: the square root of the covariance product has an imaginary component '
                             f'({max_imag:g}); the statistics are not valid covariances')
        covmean = covmean.real

    diff = mu_a - mu_b
    return float(diff @ diff + np.trace(sigma_a) + np.trace(sigma_b) - 2 * np.trace(covmean))


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


def kid_from_features(gen_features: np.ndarray | torch.Tensor, real_features: np.ndarray | torch.Tensor,
                      num_subsets: int = 100, max_subset_size: int = 1000, seed: int = 0,
                      device: torch.device | str = 'cpu') -> float:
    """Kernel Inception Distance (Binkowski et al. 2018), with StyleGAN2-ADA's subset protocol.

    With the cubic polynomial kernel k(a, b) = (a.b / d + 1)^3 on d-dimensional features, the
    unbiased estimate of the squared maximum mean discrepancy between subsets x (generated) and
    y (real) of m samples each is

        MMD^2 = sum_{i != j} [k(x_i, x_j) + k(y_i, y_j)] / (m (m - 1)) - 2 sum_{i,j} k(x_i, y_j) / m^2

    KID is its mean over `num_subsets` subsets of m = min(n_gen, n_real, max_subset_size) samples drawn
    without replacement (by a generator seeded with `seed`, so the result is reproducible).
    """
    x_all = torch.as_tensor(gen_features, device=device).to(torch.float64)
    y_all = torch.as_tensor(real_features, device=device).to(torch.float64)
    if x_all.ndim != 2 or y_all.ndim != 2 or x_all.shape[1] != y_all.shape[1]:
        raise ValueError(f'KID: mismatched feature sets {tuple(x_all.shape)} and {tuple(y_all.shape)}')
    d = x_all.shape[1]
    m = min(len(x_all), len(y_all), max_subset_size)
    if m < 2:
        raise ValueError('KID: needs at least 2 samples of each set')
    rng = np.random.default_rng(seed)
    total = 0.0
    for _subset in range(num_subsets):
        x = x_all[torch.from_numpy(rng.choice(len(x_all), m, replace=False)).to(device)]
        y = y_all[torch.from_numpy(rng.choice(len(y_all), m, replace=False)).to(device)]
        k_xx = (x @ x.T / d + 1) ** 3
        k_yy = (y @ y.T / d + 1) ** 3
        k_xy = (x @ y.T / d + 1) ** 3
        within = k_xx.sum() - k_xx.diagonal().sum() + k_yy.sum() - k_yy.diagonal().sum()
        total += float(within / (m * (m - 1)) - 2 * k_xy.sum() / (m * m))
    return total / num_subsets


def precision_recall_from_features(real_features: np.ndarray | torch.Tensor, gen_features: np.ndarray | torch.Tensor,
                                   nhood_size: int = 3, batch_size: int = 4096,
                                   device: torch.device | str = 'cpu') -> tuple[float, float]:
    """Improved precision and recall (Kynkaanniemi et al. 2019).

    Each sample of a set is the centre of a ball reaching to its k-th nearest neighbour in the same
    set (k = `nhood_size`, the sample itself not counted); the union of the balls estimates the
    manifold of that set. With Euclidean distances between features,

        precision = fraction of generated samples inside the manifold of the real samples
        recall    = fraction of real samples inside the manifold of the generated samples

    Distances are computed for `batch_size` rows at a time on `device`.
    """
    real = torch.as_tensor(real_features, device=device).to(torch.float32)
    gen = torch.as_tensor(gen_features, device=device).to(torch.float32)
    if real.ndim != 2 or gen.ndim != 2 or real.shape[1] != gen.shape[1]:
        raise ValueError(f'precision/recall: mismatched feature sets {tuple(real.shape)} and {tuple(gen.shape)}')
    if min(len(real), len(gen)) <= nhood_size:
        raise ValueError(f'precision/recall: needs more than {nhood_size} samples of each set')
    precision = _fraction_in_manifold(manifold=real, probes=gen, nhood_size=nhood_size, batch_size=batch_size)
    recall = _fraction_in_manifold(manifold=gen, probes=real, nhood_size=nhood_size, batch_size=batch_size)
    return precision, recall


def _fraction_in_manifold(manifold: torch.Tensor, probes: torch.Tensor, nhood_size: int, batch_size: int) -> float:
    # The nearest neighbour of a manifold sample within the manifold is itself, at distance 0: take the (k+1)-th.
    radii = torch.cat([torch.cdist(rows, manifold).kthvalue(nhood_size + 1, dim=1).values
                       for rows in manifold.split(batch_size)])
    inside = torch.cat([(torch.cdist(rows, manifold) <= radii).any(dim=1) for rows in probes.split(batch_size)])
    return float(inside.to(torch.float64).mean())

#----------------------------------------------------------------------------
# Feature detectors.


class DetectorUnavailableError(RuntimeError):
    """The feature detector could not be fetched or loaded (typically: no network access).

    The message is one line naming the file to fetch and the option that points to a local copy;
    the training loop catches this error and carries on without metrics.
    """


_detectors: dict[tuple[str, str], torch.jit.ScriptModule] = {}  # (url, device) -> detector, loaded once per process.


def _check_torchscript(f: BinaryIO, url: str) -> BinaryIO:
    """`f`, once it has passed bounded_read's archive check and holds the constants.pkl that torch.jit.save
    writes (torch.save's weights-only files do not); ValueError (one line) otherwise."""
    archive = bounded_read.check_torch_archive(f, url)
    if not any(name.rpartition('/')[2] == 'constants.pkl' for name in archive.entries):
        raise ValueError(f'{url} is not TorchScript (no constants.pkl: written by torch.save, not torch.jit.save)')
    return f


def get_feature_detector(url: str, device: torch.device = torch.device('cpu'), num_gpus: int = 1, rank: int = 0,
                         verbose: bool = False, option: str = '--detector') -> torch.jit.ScriptModule:
    """The TorchScript feature detector at `url` (an http(s)/file URL or a local path), on `device`;
    `option` is the command-line option that replaces it, named in the error message.

    Detectors follow StyleGAN2-ADA's calling convention: uint8 images [N, 3, H, W] of any size in,
    `detector(x, return_features=True)` -> features, `detector(x, no_output_bias=True)` -> class
    probabilities. Under torch.distributed, rank 0 fetches the file into the download cache while the
    other processes wait, so it is downloaded once. Failure raises DetectorUnavailableError on every rank.
    """
    key = (url, str(device))
    if key in _detectors:
        return _detectors[key]
    if num_gpus > 1 and rank != 0:
        torch.distributed.barrier()
    error = None
    try:
        with dnnlib.util.open_url(url, verbose=verbose and rank == 0) as f:
            _detectors[key] = torch.jit.load(_check_torchscript(f, url), map_location=device).eval()
    except (OSError, RuntimeError, ValueError) as e:
        error = e
    if num_gpus > 1 and rank == 0:
        torch.distributed.barrier()
    if error is not None:
        name = os.path.basename(urllib.parse.urlparse(url).path) or 'detector.pt'
        if isinstance(error, OSError) and dnnlib.util.is_url(url):
            advice = (f'download {url} on a machine with internet access, copy it here and pass '
                      f'{option}=/path/to/{name}')
        else:
            default = VGG16_URL if option == '--pr-detector' else INCEPTION_URL
            advice = f'pass {option}=PATH_OR_URL of a TorchScript detector such as {default}'
        raise DetectorUnavailableError(f'cannot load the feature detector {url}: {dnnlib.util.first_line(error)}; {advice}') from error
    return _detectors[key]


def run_detector(detector: torch.jit.ScriptModule, images: torch.Tensor, detector_kwargs: dict) -> torch.Tensor:
    """Detector output for uint8 images [N, C, H, W]; grayscale (C = 1) is repeated to the RGB the detectors expect."""
    if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f'feature detectors take uint8 images [N, 1 or 3, H, W], got {images.dtype} {tuple(images.shape)}')
    if images.shape[1] == 1:
        images = images.repeat([1, 3, 1, 1])
    return detector(images, **detector_kwargs)

#----------------------------------------------------------------------------
# Feature statistics.


def save_npz(path: str, arrays: dict[str, Any]) -> None:
    """Write arrays to an .npz file atomically (temporary file in the same folder, then rename), so a
    crash or a full disk never leaves a truncated file under `path`."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with dnnlib.util.atomic_path(path) as tmp, open(tmp, 'wb') as f:
        np.savez(f, **arrays)


class FeatureStats:
    """Detector outputs collected batch by batch, up to `max_items` samples.

    `capture_all` keeps every feature vector (IS, KID, precision/recall need them); `capture_mean_cov`
    keeps float64 running sums S1 = sum_x x and S2 = sum_x x x^T, from which

        mean = S1 / n,    cov = (S2 - n mean mean^T) / (n - 1)

    (the unbiased covariance, as numpy.cov in the official FID code computes it).
    """

    def __init__(self, capture_all: bool = False, capture_mean_cov: bool = False, max_items: int | None = None,
                 image_shape: list[int] | None = None):
        self.capture_all = capture_all
        self.capture_mean_cov = capture_mean_cov
        self.max_items = max_items
        self.image_shape = image_shape  # [C, H, W] of the images behind the features, when known.
        self.num_items = 0
        self.num_features: int | None = None
        self.all_features: list[np.ndarray] = []
        self.raw_mean: torch.Tensor | None = None  # S1, float64, on the device of the features.
        self.raw_cov: torch.Tensor | None = None   # S2.

    def is_full(self) -> bool:
        return self.max_items is not None and self.num_items >= self.max_items

    def append(self, x: torch.Tensor) -> None:
        """Add feature vectors [N, D]; those beyond `max_items` are dropped."""
        if x.ndim != 2:
            raise ValueError(f'features must be [N, D], got {tuple(x.shape)}')
        if self.max_items is not None:
            x = x[:max(self.max_items - self.num_items, 0)]
        if self.num_features is None:
            self.num_features = x.shape[1]
            if self.capture_mean_cov:
                self.raw_mean = torch.zeros([self.num_features], dtype=torch.float64, device=x.device)
                self.raw_cov = torch.zeros([self.num_features] * 2, dtype=torch.float64, device=x.device)
        if x.shape[1] != self.num_features:
            raise ValueError(f'expected {self.num_features} features, got {x.shape[1]}')
        if self.capture_all:
            self.all_features.append(x.detach().to(torch.float32).cpu().numpy())
        if self.capture_mean_cov:
            x64 = x.detach().to(device=self.raw_mean.device, dtype=torch.float64)
            self.raw_mean += x64.sum(dim=0)
            self.raw_cov += x64.T @ x64
        self.num_items += x.shape[0]

    def append_gathered(self, x: torch.Tensor, num_gpus: int = 1) -> None:
        """Add the features of every process: each contributes an [N, D] batch of the same shape, and
        the batches are concatenated in rank order."""
        if num_gpus > 1:
            parts = [torch.empty_like(x) for _rank in range(num_gpus)]
            torch.distributed.all_gather(parts, x.contiguous())
            x = torch.cat(parts)
        self.append(x)

    def get_all(self) -> np.ndarray:
        if not self.capture_all:
            raise RuntimeError('these statistics were collected without capture_all')
        if not self.all_features:
            return np.zeros([0, self.num_features or 0], dtype=np.float32)
        return np.concatenate(self.all_features)

    def get_mean_cov(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.capture_mean_cov:
            raise RuntimeError('these statistics were collected without capture_mean_cov')
        if self.num_items < 2:
            raise ValueError(f'a covariance needs at least 2 samples, got {self.num_items}')
        n = self.num_items
        mean = self.raw_mean / n
        cov = (self.raw_cov - n * torch.outer(mean, mean)) / (n - 1)
        return mean.cpu().numpy(), cov.cpu().numpy()

    def save(self, path: str) -> None:
        """Write to an .npz file (no pickled objects), atomically."""
        arrays: dict[str, Any] = dict(capture_all=self.capture_all, capture_mean_cov=self.capture_mean_cov,
                                      max_items=-1 if self.max_items is None else self.max_items,
                                      num_items=self.num_items, num_features=self.num_features or 0)
        if self.image_shape is not None:
            arrays['image_shape'] = np.array(self.image_shape, dtype=np.int64)
        if self.capture_all:
            arrays['all_features'] = self.get_all()
        if self.capture_mean_cov:
            arrays['raw_mean'] = self.raw_mean.cpu().numpy()
            arrays['raw_cov'] = self.raw_cov.cpu().numpy()
        save_npz(path, arrays)

    @classmethod
    def load(cls, path: str) -> FeatureStats:
        with np.load(path, allow_pickle=False) as data:
            max_items = int(data['max_items'])
            stats = cls(capture_all=bool(data['capture_all']), capture_mean_cov=bool(data['capture_mean_cov']),
                        max_items=None if max_items < 0 else max_items,
                        image_shape=data['image_shape'].tolist() if 'image_shape' in data else None)
            stats.num_items = int(data['num_items'])
            stats.num_features = int(data['num_features']) or None
            if stats.capture_all:
                stats.all_features = [data['all_features']]
            if stats.capture_mean_cov:
                stats.raw_mean = torch.from_numpy(data['raw_mean'])
                stats.raw_cov = torch.from_numpy(data['raw_cov'])
        return stats

#----------------------------------------------------------------------------
# Options shared by the metrics.


class MetricOptions:
    """What a metric needs besides its protocol numbers (which the metric itself fixes)."""

    def __init__(self,
        G: torch.nn.Module | None = None,       # Generator, called as G(z, c); copied, never modified.
        dataset_kwargs: dict | None = None,     # Training set (reference of the `_full` metrics, label distribution of conditional G).
        ref_dataset_kwargs: dict | None = None, # Reference split of `fid50k` / `fid10k` (e.g. the CIFAR-10 test set).
        images_kwargs: dict | None = None,      # Dataset of images evaluated in place of G (e.g. a folder of generated images).
        ref_stats: str | None = None,           # .npz of Inception mu / sigma: the real side of every FID metric.
        num_gpus: int = 1,                      # Number of processes under torch.distributed.
        rank: int = 0,                          # Rank of this process.
        device: torch.device | None = None,     # Device of G and the detectors (None = CPU).
        detector_url: str | None = None,        # Inception-v3 of FID, IS and KID (None = INCEPTION_URL).
        pr_detector_url: str | None = None,     # VGG16 of precision/recall (None = VGG16_URL).
        cache: bool = True,                     # Read and write cached dataset statistics.
        progress: Callable[[str], None] | None = None, # Receives one-line progress messages on rank 0.
        mirror: bool = False,                   # Add x-flipped copies of the real images (not the paper protocol).
        num_gen: int | None = None,             # Override of the number of generated images (tests, quick looks).
        max_real: int | None = None,            # Override (upper bound) of the number of real images.
        seed: int = 0,                          # Seed of the latents and labels fed to G, and of the subset of `images_kwargs`.
        batch_size: int = 64,                   # Images per process per detector call.
        gen_batch_size: int = 16,               # Images per G call (bounds G's memory at high resolution).
        num_workers: int | None = None,         # Data loader worker processes (None = 3, or fewer on fewer CPUs).
    ):
        self.G = G
        self.dataset_kwargs = dnnlib.EasyDict(dataset_kwargs or {})
        self.ref_dataset_kwargs = dnnlib.EasyDict(ref_dataset_kwargs) if ref_dataset_kwargs is not None else None
        self.images_kwargs = dnnlib.EasyDict(images_kwargs) if images_kwargs is not None else None
        self.ref_stats = ref_stats
        self.num_gpus = num_gpus
        self.rank = rank
        self.device = device if device is not None else torch.device('cpu')
        self.detector_url = detector_url
        self.pr_detector_url = pr_detector_url
        self.cache = cache
        self.progress = progress
        self.mirror = mirror
        self.num_gen = num_gen
        self.max_real = max_real
        self.seed = seed
        self.batch_size = batch_size
        self.gen_batch_size = gen_batch_size
        if num_workers is None:
            num_cpus = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else (os.cpu_count() or 1)
            num_workers = min(3, num_cpus)
        self.num_workers = num_workers
        # What the metric used, for its result: data / ref_data / images / ref_stats (absolute paths),
        # num_real / num_gen (image counts).
        self.info = dnnlib.EasyDict()

    def log(self, message: str) -> None:
        if self.progress is not None and self.rank == 0:
            self.progress(message)

    def detector_option(self, detector_url: str) -> str:
        """The command-line option that replaces the detector at `detector_url` (for error messages)."""
        return '--pr-detector' if detector_url == (self.pr_detector_url or VGG16_URL) else '--detector'

    def progress_counter(self, what: str, total: int) -> Callable[[int], None]:
        """A function to call with the number of items done; it logs the start, the end, and
        at most one line per _PROGRESS_INTERVAL_S seconds in between."""
        self.log(f'{what}: {total} images')
        start = last = time.time()

        def update(done: int) -> None:
            nonlocal last
            now = time.time()
            if done >= total or now - last >= _PROGRESS_INTERVAL_S:
                last = now
                self.log(f'{what}: {min(done, total)}/{total} images, {dnnlib.util.format_time(now - start)}')
        return update


def real_dataset_kwargs(opts: MetricOptions, use_ref_data: bool) -> dnnlib.EasyDict:
    """Dataset kwargs of the real images a metric compares with: all images of the training set or of
    the reference split (no `max_size` subset), x-flipped copies only with `opts.mirror`."""
    if use_ref_data:
        if opts.ref_dataset_kwargs is None:
            raise ValueError('this metric compares with a reference split: give one with --ref-data (or --ref-stats for FID)')
        kwargs = opts.ref_dataset_kwargs
    else:
        if not opts.dataset_kwargs:
            raise ValueError('this metric needs the training set: give it with --data')
        kwargs = opts.dataset_kwargs
    return dnnlib.EasyDict(kwargs, max_size=None, xflip=opts.mirror, use_labels=False)


def data_path(dataset_kwargs: dict) -> str | None:
    """Absolute path of a dataset's folder or zip (as it is recorded in results), None if it has none."""
    path = dataset_kwargs.get('path')
    if not isinstance(path, str):
        return None
    return path if dnnlib.util.is_url(path) else os.path.abspath(path)


def _describe_shape(image_shape: list[int]) -> str:
    channels, height, width = image_shape
    kind = {1: 'grayscale', 3: 'RGB'}.get(channels, f'{channels}-channel')
    return f'{width}x{height} {kind}'


def check_fits_generator(opts: MetricOptions, image_shape: list[int] | None, dataset_kwargs: dict) -> None:
    """Refuse (ValueError, one line) to compare opts.G with real images of another resolution or
    number of channels. Nothing to check without a generator or without a known image shape."""
    if opts.G is None or image_shape is None:
        return
    G_shape = [opts.G.img_channels, opts.G.img_resolution, opts.G.img_resolution]
    if list(image_shape) != G_shape:
        raise ValueError(f'the dataset {dataset_kwargs.get("path")} holds {_describe_shape(image_shape)} images, but the '
                         f'generator makes {_describe_shape(G_shape)} images: compare it with data of its own kind')

#----------------------------------------------------------------------------
# Feature extraction.


def _file_identity(path_or_url: str) -> tuple[str, list[int] | None]:
    """A local file as its absolute path plus (size, mtime), so that a rebuilt file gets new cache
    entries; a URL as itself."""
    if dnnlib.util.is_url(path_or_url):
        return path_or_url, None
    path = os.path.abspath(path_or_url)
    if not os.path.exists(path):
        raise FileNotFoundError(f'{path_or_url} does not exist')
    st = os.stat(path)
    return path, [st.st_size, st.st_mtime_ns]


def dataset_fingerprint(path: str) -> str:
    """MD5 of what identifies the images of a dataset folder or zip, without reading any image:

    * zip: name, CRC-32 and size of every entry, from the central directory (the archive's table of
      contents, read in one go). The CRC is that of the entry's bytes, so changing, adding, removing or
      renaming any file changes the fingerprint, while a rebuilt archive of the same files keeps it.
    * folder (recursive, as the dataset reads it): relative path, size, modification and status-change
      times (ns) of every file. Writing a file updates both times, and the status-change time cannot
      be set back by tools that restore modification times (cp -p, rsync -t), so no edit goes
      unnoticed; a mere `touch` or `chmod` makes the statistics be recomputed once.

    Cost: one stat per file (folder) or one read of the central directory (zip); see docs/metrics.md.
    """
    digest = hashlib.md5()
    if os.path.isdir(path):
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames.sort()  # Walk in a fixed order.
            rel = os.path.relpath(dirpath, path)
            for name in sorted(filenames):
                st = os.stat(os.path.join(dirpath, name))
                entry = f'{os.path.join(rel, name)}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\n'
                digest.update(entry.encode('utf-8', 'surrogateescape'))
    elif zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                digest.update(f'{info.filename}\0{info.CRC}\0{info.file_size}\n'.encode('utf-8', 'surrogateescape'))
    else:
        st = os.stat(path)  # Not a dataset the loader can read; it will say so. Key by size and times.
        digest.update(f'{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}'.encode())
    return digest.hexdigest()


def stats_cache_file(dataset_kwargs: dict, detector_url: str, detector_kwargs: dict, stats_kwargs: dict) -> str:
    """Cache file of a dataset's statistics: keyed by the dataset's content (`dataset_fingerprint` of
    its folder or zip, in place of its path, so a copy elsewhere shares the entry) and its other kwargs
    except the labels, which do not change the images; the detector (path with size and mtime, or URL)
    and its kwargs; and the statistics collected (protocol, max items). Lives under
    $GNGAN_CACHE_DIR/metrics (default ~/.cache/gngan/metrics)."""
    dataset_kwargs = {k: v for k, v in dataset_kwargs.items() if k != 'use_labels'}
    path = dataset_kwargs.get('path')
    dataset_id = None
    if isinstance(path, str) and not dnnlib.util.is_url(path):
        if not os.path.exists(path):
            raise FileNotFoundError(f'dataset {path} does not exist')
        dataset_id = dataset_fingerprint(path)
        dataset_kwargs['path'] = None
    detector_url, detector_id = _file_identity(detector_url)
    key = dict(dataset=dataset_kwargs, dataset_id=dataset_id, detector_url=detector_url, detector_id=detector_id,
               detector_kwargs=detector_kwargs, stats=stats_kwargs)
    md5 = hashlib.md5(json.dumps(key, sort_keys=True, default=str).encode('utf-8')).hexdigest()
    dataset_name = os.path.splitext(os.path.basename(os.path.normpath(str(path or 'dataset'))))[0]
    detector_name = os.path.splitext(os.path.basename(urllib.parse.urlparse(detector_url).path))[0]
    return os.path.join(dnnlib.util.default_cache_dir(), 'metrics', f'{dataset_name}-{detector_name}-{md5}.npz')


def _accumulate_dataset_features(opts: MetricOptions, dataset: torch.utils.data.Dataset, num_items: int,
                                 detector: torch.jit.ScriptModule, detector_kwargs: dict, stats: FeatureStats,
                                 what: str) -> None:
    """Add the detector outputs of the first `num_items` items of `dataset` to `stats`, all processes together.

    At each step, process r takes the r-th of num_gpus consecutive blocks of images (indices wrap
    around at the end), so concatenating the gathered blocks in rank order restores dataset order and
    the statistics do not depend on the number of processes.
    """
    batch = min(opts.batch_size, math.ceil(num_items / opts.num_gpus))
    num_steps = math.ceil(num_items / (batch * opts.num_gpus))
    item_subset = [((step * opts.num_gpus + opts.rank) * batch + i) % num_items
                   for step in range(num_steps) for i in range(batch)]
    loader_kwargs = dict(num_workers=opts.num_workers, prefetch_factor=2) if opts.num_workers > 0 else {}
    loader = torch.utils.data.DataLoader(dataset, sampler=item_subset, batch_size=batch, **loader_kwargs)
    update = opts.progress_counter(what, num_items)
    for images, _labels in loader:
        features = run_detector(detector, images.to(opts.device), detector_kwargs)
        stats.append_gathered(features, opts.num_gpus)
        update(stats.num_items)


@torch.no_grad()
def compute_feature_stats_for_dataset(opts: MetricOptions, dataset_kwargs: dict, detector_url: str,
                                      detector_kwargs: dict, max_items: int | None = None,
                                      **stats_kwargs: Any) -> FeatureStats:
    """Detector statistics of the first `max_items` images of a dataset (None = all), computed by all
    processes together and cached. With a cache hit the images are not read. When opts.G is set, the
    dataset must hold images of G's shape (`check_fits_generator`), checked before any work.
    """
    if opts.max_real is not None:
        max_items = opts.max_real if max_items is None else min(max_items, opts.max_real)
    stats_kwargs = dict(stats_kwargs, max_items=max_items)
    # Loaded first even when the statistics are cached: the generated images need it anyway, and a
    # missing detector should fail the same way (DetectorUnavailableError) every time.
    detector = get_feature_detector(detector_url, device=opts.device, num_gpus=opts.num_gpus, rank=opts.rank,
                                    verbose=opts.progress is not None, option=opts.detector_option(detector_url))
    cache_file = stats_cache_file(dataset_kwargs, detector_url, detector_kwargs, stats_kwargs) if opts.cache else None

    if cache_file is not None:
        found = os.path.isfile(cache_file)
        if opts.num_gpus > 1:  # Use the cache only if every process sees the file.
            flag = torch.tensor(float(found), device=opts.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
            found = bool(flag.item())
        if found:
            opts.log(f'Using cached dataset statistics {cache_file}')
            stats = FeatureStats.load(cache_file)
            check_fits_generator(opts, stats.image_shape, dataset_kwargs)
            return stats

    dataset = dnnlib.util.construct_class_by_name(**dataset_kwargs)
    check_fits_generator(opts, dataset.image_shape, dataset_kwargs)
    num_items = len(dataset) if max_items is None else min(len(dataset), max_items)
    if num_items == 0:
        raise ValueError(f'dataset {dataset_kwargs.get("path")} has no images')
    stats = FeatureStats(**dict(stats_kwargs, max_items=num_items), image_shape=list(dataset.image_shape))
    _accumulate_dataset_features(opts, dataset, num_items, detector, detector_kwargs, stats,
                                 what=f'Dataset features ({os.path.basename(str(dataset_kwargs.get("path")))})')
    if cache_file is not None and opts.rank == 0:
        stats.save(cache_file)
    return stats


def compute_feature_stats_for_real(opts: MetricOptions, use_ref_data: bool, detector_url: str, detector_kwargs: dict,
                                   max_items: int | None = None, **stats_kwargs: Any) -> FeatureStats:
    """Detector statistics of the real images a metric compares with (`real_dataset_kwargs`); records
    the dataset (opts.info.data, or .ref_data with `use_ref_data`) and opts.info.num_real."""
    dataset_kwargs = real_dataset_kwargs(opts, use_ref_data)
    stats = compute_feature_stats_for_dataset(opts, dataset_kwargs, detector_url=detector_url,
                                              detector_kwargs=detector_kwargs, max_items=max_items, **stats_kwargs)
    opts.info['ref_data' if use_ref_data else 'data'] = data_path(dataset_kwargs)
    opts.info.num_real = stats.num_items
    return stats


def _compute_feature_stats_for_images(opts: MetricOptions, detector: torch.jit.ScriptModule, detector_kwargs: dict,
                                      num_items: int, **stats_kwargs: Any) -> FeatureStats:
    """Detector statistics of `num_items` images of opts.images_kwargs, standing in for generated images:
    all of them, or a random subset (seeded with opts.seed) when there are more; fewer are refused,
    since the metric's name promises its number of images. Never cached, never mirrored."""
    kwargs = dnnlib.EasyDict(opts.images_kwargs, max_size=num_items, random_seed=opts.seed, xflip=False, use_labels=False)
    dataset = dnnlib.util.construct_class_by_name(**kwargs)
    if len(dataset) < num_items:
        raise ValueError(f'{kwargs.get("path")} holds {len(dataset)} images, but this metric evaluates {num_items}; '
                         f'use a metric of at most {len(dataset)} generated images')
    stats = FeatureStats(max_items=num_items, image_shape=list(dataset.image_shape), **stats_kwargs)
    _accumulate_dataset_features(opts, dataset, num_items, detector, detector_kwargs, stats,
                                 what=f'Image features ({os.path.basename(str(kwargs.get("path")))})')
    opts.info.update(images=data_path(kwargs), num_gen=stats.num_items)
    return stats


@torch.no_grad()
def compute_feature_stats_for_generator(opts: MetricOptions, detector_url: str, detector_kwargs: dict,
                                        max_items: int, **stats_kwargs: Any) -> FeatureStats:
    """Detector statistics of `max_items` images of opts.G (overridden by opts.num_gen), or of the
    images of opts.images_kwargs standing in for G; records opts.info.num_gen.

    z ~ N(0, I) of G.z_dim; for a conditional G, labels drawn uniformly from the training set's labels,
    i.e. from its label distribution. Images are generated in blocks: block b's latents and labels come
    from an RNG seeded with (opts.seed, b), and process r generates blocks r, r + num_gpus, ..., so the
    images, and the statistics, are the same for any number of processes. G's output in [-1, 1] becomes
    uint8 as round-to-nearest of x * 127.5 + 127.5, clamped to [0, 255].
    """
    if opts.num_gen is not None:
        max_items = opts.num_gen
    detector = get_feature_detector(detector_url, device=opts.device, num_gpus=opts.num_gpus, rank=opts.rank,
                                    verbose=opts.progress is not None, option=opts.detector_option(detector_url))
    if opts.images_kwargs is not None:
        return _compute_feature_stats_for_images(opts, detector, detector_kwargs, max_items, **stats_kwargs)

    G = copy.deepcopy(opts.G).eval().requires_grad_(False).to(opts.device)
    label_dataset = None
    if G.c_dim > 0:
        if not opts.dataset_kwargs:
            raise ValueError('a conditional generator draws its labels from the training set: give it with --data')
        label_dataset = dnnlib.util.construct_class_by_name(**dict(opts.dataset_kwargs, use_labels=True))
        if label_dataset.label_dim != G.c_dim:
            raise ValueError(f'the generator is conditional on {G.c_dim} classes, but the dataset '
                             f'{opts.dataset_kwargs.get("path")} has {label_dataset.label_dim} label dimensions')
        opts.info.data = data_path(opts.dataset_kwargs)

    stats = FeatureStats(max_items=max_items, **stats_kwargs)
    batch = min(opts.batch_size, max_items)
    update = opts.progress_counter('Generator features', max_items)
    block = opts.rank
    while not stats.is_full():
        rng = np.random.default_rng([opts.seed, block])
        z = torch.from_numpy(rng.standard_normal([batch, G.z_dim], dtype=np.float32)).to(opts.device)
        if label_dataset is not None:
            labels = [label_dataset.get_label(i) for i in rng.integers(len(label_dataset), size=batch)]
            c = torch.from_numpy(np.stack(labels).astype(np.float32)).to(opts.device)
        else:
            c = torch.zeros([batch, 0], device=opts.device)
        images = torch.cat([G(z_part, c_part) for z_part, c_part in
                            zip(z.split(opts.gen_batch_size), c.split(opts.gen_batch_size))])
        images = (images * 127.5 + 128).clamp(0, 255).to(torch.uint8)
        stats.append_gathered(run_detector(detector, images, detector_kwargs), opts.num_gpus)
        block += opts.num_gpus
        update(stats.num_items)
    opts.info.num_gen = stats.num_items
    return stats


def compute_all_features(opts: MetricOptions, detector_url: str, max_real: int | None,
                         num_gen: int) -> tuple[np.ndarray, np.ndarray]:
    """Every feature vector ([N, D]) of up to `max_real` training images (None = all) and of `num_gen`
    generated images: what KID and precision/recall compare, sample by sample, rather than as moments."""
    detector_kwargs = dict(return_features=True)
    real_features = compute_feature_stats_for_real(
        opts, use_ref_data=False, detector_url=detector_url, detector_kwargs=detector_kwargs,
        max_items=max_real, capture_all=True).get_all()
    gen_features = compute_feature_stats_for_generator(
        opts, detector_url=detector_url, detector_kwargs=detector_kwargs, max_items=num_gen, capture_all=True).get_all()
    return real_features, gen_features
