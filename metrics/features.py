"""Feature extraction shared by the metrics: detector outputs of real images, generated images, or a
folder/zip of images standing in for a generator.

* `FeatureStats`: detector outputs collected batch by batch (all of them, or the sums behind their mean
  and covariance), gathered across processes, and saved to / loaded from the statistics cache.
* `MetricOptions`: what a metric needs besides its protocol numbers (generator, data, devices, processes).
* Feature extraction over a dataset (cached, keyed by `dataset_fingerprint` of its content) and over a
  generator or a folder/zip of images standing in for one, split across processes.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import time
import urllib.parse
import zipfile
from typing import Any, Callable

import numpy as np
import torch

import dnnlib

from . import detectors

_PROGRESS_INTERVAL_S = 30  # At most one progress line per this many seconds within a stage.

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
        D: torch.nn.Module | None = None,       # Discriminator, called as D(img, c) (L_D, metrics/lipschitz.py); copied.
        d_score: Any = None,                    # The output of D the run's loss sees (metrics/lipschitz.py's DScore).
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
        bn_batch: int | None = None,            # None: G in eval mode (BatchNorm with its running statistics); N: G in
                                                # training mode on N images per call, BatchNorm normalizing with each
                                                # batch's statistics, as the GN-GAN authors evaluate (N: their G batch).
        num_workers: int | None = None,         # Data loader worker processes (None = 3, or fewer on fewer CPUs).
        interrupt: Callable[[], None] | None = None, # Called after every batch, by every process together; raising abandons the metric.
    ):
        self.G = G
        self.D = D
        self.d_score = d_score
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
        self.bn_batch = bn_batch
        if num_workers is None:
            num_cpus = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else (os.cpu_count() or 1)
            num_workers = min(3, num_cpus)
        self.num_workers = num_workers
        self.interrupt = interrupt
        # What the metric used, for its result: data / ref_data / images / ref_stats (absolute paths),
        # num_real / num_gen (image counts).
        self.info = dnnlib.EasyDict()

    def log(self, message: str) -> None:
        if self.progress is not None and self.rank == 0:
            self.progress(message)

    def detector_option(self, detector_url: str) -> str:
        """The command-line option that replaces the detector at `detector_url` (for error messages)."""
        return '--pr-detector' if detector_url == (self.pr_detector_url or detectors.VGG16_URL) else '--detector'

    def progress_counter(self, what: str, total: int) -> Callable[[int], None]:
        """A function to call with the number of items done, after every batch; it logs the start, the end, and
        at most one line per _PROGRESS_INTERVAL_S seconds in between, and calls `interrupt`."""
        self.log(f'{what}: {total} images')
        start = last = time.time()

        def update(done: int) -> None:
            nonlocal last
            if self.interrupt is not None:
                self.interrupt()
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
    except the labels, which do not change the images, with the dataset class by its name alone (not
    the module it lives in); the detector (path with size and mtime, or URL)
    and its kwargs and arithmetic (detectors.ARITHMETIC); and the statistics collected (protocol, max items).
    Lives under $GNGAN_CACHE_DIR/metrics (default ~/.cache/gngan/metrics)."""
    dataset_kwargs = {k: v for k, v in dataset_kwargs.items() if k != 'use_labels'}
    if isinstance(dataset_kwargs.get('class_name'), str):
        dataset_kwargs['class_name'] = dataset_kwargs['class_name'].rsplit('.', 1)[-1]
    path = dataset_kwargs.get('path')
    dataset_id = None
    if isinstance(path, str) and not dnnlib.util.is_url(path):
        if not os.path.exists(path):
            raise FileNotFoundError(f'dataset {path} does not exist')
        dataset_id = dataset_fingerprint(path)
        dataset_kwargs['path'] = None
    detector_url, detector_id = _file_identity(detector_url)
    key = dict(dataset=dataset_kwargs, dataset_id=dataset_id, detector_url=detector_url, detector_id=detector_id,
               detector_kwargs=detector_kwargs, arithmetic=detectors.ARITHMETIC, stats=stats_kwargs)
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
        features = detectors.run_detector(detector, images.to(opts.device), detector_kwargs)
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
    detector = detectors.get_feature_detector(detector_url, device=opts.device, num_gpus=opts.num_gpus,
                                              rank=opts.rank, verbose=opts.progress is not None,
                                              option=opts.detector_option(detector_url))
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
    detector = detectors.get_feature_detector(detector_url, device=opts.device, num_gpus=opts.num_gpus,
                                              rank=opts.rank, verbose=opts.progress is not None,
                                              option=opts.detector_option(detector_url))
    if opts.images_kwargs is not None:
        return _compute_feature_stats_for_images(opts, detector, detector_kwargs, max_items, **stats_kwargs)

    # A copy, so that training-mode BatchNorm (bn_batch) updates its running statistics, not the caller's G's.
    G = copy.deepcopy(opts.G).train(opts.bn_batch is not None).requires_grad_(False).to(opts.device)
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
    batch = min(opts.batch_size, max_items) if opts.bn_batch is None else opts.bn_batch
    gen_batch = opts.gen_batch_size if opts.bn_batch is None else opts.bn_batch
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
                            zip(z.split(gen_batch), c.split(gen_batch))])
        images = (images * 127.5 + 128).clamp(0, 255).to(torch.uint8)
        stats.append_gathered(detectors.run_detector(detector, images, detector_kwargs), opts.num_gpus)
        block += opts.num_gpus
        update(stats.num_items)
    opts.info.num_gen = stats.num_items
    if opts.bn_batch is not None:
        opts.info.bn_batch = opts.bn_batch
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
