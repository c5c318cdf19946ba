"""Registry of the named metrics, the entry point that evaluates one, and the report of its result.

A metric name fixes its protocol (how many generated images, which real images), so that numbers
with the same name are comparable: `fid50k_full` is always 50k generated images against the whole
training set. `calc_metric` accepts `num_gen` / `max_real` overrides for tests and quick looks. Every
result records the data it compared with (absolute paths) and its image counts, so a number computed
away from the named protocol, or against another reference, is never mistaken for it.
"""

from __future__ import annotations

import json
import os
import time
from typing import Callable

import torch

import dnnlib
from torch_utils import devices

from . import detectors, features
from . import frechet_inception_distance, inception_score, kernel_inception_distance, lipschitz, precision_recall

#----------------------------------------------------------------------------

_metric_dict: dict[str, Callable[[features.MetricOptions], dict[str, float]]] = {}
_VGG16_METRICS = {'pr50k3_full'}  # Metrics on VGG16 features (precision/recall).
_NO_DETECTOR_METRICS = {'lipschitz1k', 'lipschitz50k'}  # Metrics of D's gradients; the others use Inception-v3.


def register_metric(fn: Callable[[features.MetricOptions], dict[str, float]]) -> Callable:
    """Decorator: the function's name becomes the metric's name; it returns {result name: value}."""
    _metric_dict[fn.__name__] = fn
    return fn


def is_valid_metric(metric: str) -> bool:
    return metric in _metric_dict


def list_valid_metrics() -> list[str]:
    return list(_metric_dict.keys())


def is_fid_metric(metric: str) -> bool:
    """FID metrics: one result, named like the metric, lower is better; `--ref-stats` applies to them."""
    return is_valid_metric(metric) and metric.startswith('fid')


def parse_metrics(text: str) -> tuple[str, ...]:
    """The metric names of a comma-separated --metrics list ('none': no metric), as given (check_metrics checks them)."""
    return () if text.strip().lower() == 'none' else tuple(name.strip() for name in text.split(',') if name.strip())


def check_metrics(metrics: tuple[str, ...], best_metric: str | None, has_reference: bool) -> str | None:
    """Check a run's metrics and return the one that decides `network-best.pkl`; ValueError with a one-line message
    naming an unknown metric, or a metric that compares with a reference split (fid50k, fid10k) when the run has
    none (`has_reference`: --ref-data or --ref-stats given).

    The best metric is `best_metric` when given: it must be one of `metrics` and a FID metric, so that a single
    protocol decides and lower is better; else the first FID metric of `metrics`; None when there is none (no best
    snapshot). Its value is `result.results[name]`.
    """
    unknown = [name for name in metrics if not is_valid_metric(name)]
    if unknown:
        raise ValueError(f'--metrics: unknown {", ".join(unknown)}; valid: {", ".join(list_valid_metrics())}')
    if any(metric in ('fid50k', 'fid10k') for metric in metrics) and not has_reference:
        raise ValueError('--metrics=fid50k/fid10k compare with a reference split: give it with --ref-data or --ref-stats')
    if best_metric is None:
        return next((metric for metric in metrics if is_fid_metric(metric)), None)
    if not is_fid_metric(best_metric):
        valid = [metric for metric in list_valid_metrics() if is_fid_metric(metric)]
        raise ValueError(f'--best-metric={best_metric}: the best snapshot is decided by a FID metric '
                         f'({", ".join(valid)})')
    if best_metric not in metrics:
        raise ValueError(f'--best-metric={best_metric} is not evaluated: add it to --metrics '
                         f'({",".join(metrics) or "none"})')
    return best_metric


def check_references(ref_data: str | None, ref_stats: str | None) -> None:
    """ValueError with a one-line message unless --ref-data and --ref-stats, where given, exist."""
    for option, path in [('--ref-data', ref_data), ('--ref-stats', ref_stats)]:
        if path is not None and not os.path.exists(path):
            raise ValueError(f'{option}: no such file or folder: {path}')


def check_detectors(metrics: list[str], detector_url: str | None = None, pr_detector_url: str | None = None) -> None:
    """Load every feature detector that `metrics` need (a URL is fetched into the download cache), so that a
    run learns at its start, not at its first snapshot, that one is missing, unreachable or not a detector:
    DetectorUnavailableError with one line naming the option that replaces it."""
    needed = {(pr_detector_url or detectors.VGG16_URL, '--pr-detector') if metric in _VGG16_METRICS else
              (detector_url or detectors.INCEPTION_URL, '--detector') for metric in metrics
              if metric not in _NO_DETECTOR_METRICS}
    for url, option in sorted(needed):
        detectors.get_feature_detector(url, option=option)


def calc_metric(metric: str, G: torch.nn.Module | None = None, dataset_kwargs: dict | None = None,
                ref_dataset_kwargs: dict | None = None, images_kwargs: dict | None = None, ref_stats: str | None = None,
                num_gpus: int = 1, rank: int = 0, device: torch.device = torch.device('cpu'),
                detector_url: str | None = None, pr_detector_url: str | None = None, cache: bool = True,
                progress: Callable[[str], None] | None = None, mirror: bool = False, num_gen: int | None = None,
                max_real: int | None = None, num_workers: int | None = None,
                interrupt: Callable[[], None] | None = None, generator: str | None = None,
                bn_batch: int | None = None, D: torch.nn.Module | None = None, d_score: lipschitz.DScore | None = None) -> dnnlib.EasyDict:
    """Evaluate one metric of generator G, or of the images of `images_kwargs` standing in for G; every
    process of a torch.distributed group calls it together.

    dataset_kwargs: the training set (reference of the `_full` metrics; label distribution of a
    conditional G); ref_dataset_kwargs: the reference split of `fid50k` / `fid10k`; images_kwargs: a
    dataset of images (e.g. generated by another codebase) evaluated instead of G; ref_stats: an .npz of
    Inception mu / sigma that every FID metric compares with instead of a dataset; detector_url: the
    Inception-v3 of FID, IS and KID; pr_detector_url: the VGG16 of precision/recall (None: the official
    exports); cache: use the dataset statistics cache; progress: receives one-line messages on rank 0;
    mirror: add x-flipped real images (not the paper protocol); num_gen / max_real: override the
    protocol's image counts (tests, quick looks); num_workers: data loader worker processes (None = 3,
    or fewer on fewer CPUs); interrupt: called after every batch by every process together, an exception
    it raises abandons the evaluation (a training run's stop signal); generator: which of a snapshot's generators G
    is ('G' or 'G_ema'), recorded with the result; bn_batch: None scores G in eval mode, N in training mode on N
    images per call, its BatchNorm layers normalizing with each batch's statistics (the authors' evaluation); D and
    d_score: the discriminator and the output of it that the run's loss sees (training.step.LossScore of its --norm,
    recorded as `norm`), which the L_D metrics (lipschitz1k, lipschitz50k) differentiate.

    The whole metric (G's images, the detector's features, the metric's own arithmetic) runs with TF32 off
    (torch_utils/devices.full_precision) whatever the caller's switches, e.g. a --precision=tf32 training run's,
    and the switches are restored afterwards.

    Returns EasyDict(results={name: value}, metric, total_time, total_time_str, num_gpus, num_gen, and
    as far as they apply num_real, data, ref_data, ref_stats, images (absolute paths), max_real, mirror, generator, bn_batch,
    detector, pr_detector), with the same results on every rank. Raises DetectorUnavailableError when
    the detector cannot be fetched, ValueError for an unknown metric, missing or mismatched data.
    """
    if not is_valid_metric(metric):
        raise ValueError(f'unknown metric "{metric}"; valid metrics: {", ".join(list_valid_metrics())}')
    if (G is None) == (images_kwargs is None):
        raise ValueError('give either a generator or images to evaluate')
    opts = features.MetricOptions(G=G, dataset_kwargs=dataset_kwargs, ref_dataset_kwargs=ref_dataset_kwargs,
                                  images_kwargs=images_kwargs, ref_stats=ref_stats if is_fid_metric(metric) else None,
                                  num_gpus=num_gpus, rank=rank, device=device, detector_url=detector_url,
                                  pr_detector_url=pr_detector_url, cache=cache, progress=progress, mirror=mirror,
                                  num_gen=num_gen, max_real=max_real, num_workers=num_workers, interrupt=interrupt,
                                  bn_batch=bn_batch, D=D, d_score=d_score)
    start_time = time.time()
    with devices.full_precision():  # G's images and the metric's distances too, not only the features.
        results = _metric_dict[metric](opts)
    total_time = time.time() - start_time

    # Only rank 0 computes the final numbers; share them.
    for name, value in list(results.items()):
        if num_gpus > 1:
            value = torch.as_tensor(value, dtype=torch.float64, device=device)
            torch.distributed.broadcast(value, src=0)
        results[name] = float(value)

    result = dnnlib.EasyDict(results=dnnlib.EasyDict(results), metric=metric, total_time=total_time,
                             total_time_str=dnnlib.util.format_time(total_time), num_gpus=num_gpus)
    detectors = (dict(pr_detector=pr_detector_url) if metric in _VGG16_METRICS else
                 dict(norm=getattr(d_score, 'norm', None)) if metric in _NO_DETECTOR_METRICS else dict(detector=detector_url))
    fields = dict(opts.info, max_real=max_real, mirror=mirror or None, generator=generator, **detectors)
    result.update({name: value for name, value in fields.items() if value is not None})
    return result


def report_metric(result_dict: dict, run_dir: str | None = None, snapshot_pkl: str | None = None) -> str | None:
    """Append the result as one JSON line to `metric-<name>.jsonl` in `run_dir` (default: the folder of
    a local `snapshot_pkl`; no file when there is neither). Returns the path written, if any."""
    metric = result_dict['metric']
    if not is_valid_metric(metric):
        raise ValueError(f'unknown metric "{metric}"')
    if run_dir is None and snapshot_pkl is not None and os.path.isfile(snapshot_pkl):
        run_dir = os.path.dirname(os.path.abspath(snapshot_pkl))
    if run_dir is not None and snapshot_pkl is not None and os.path.isfile(snapshot_pkl):
        snapshot_pkl = os.path.relpath(snapshot_pkl, run_dir)
    line = json.dumps(dict(dnnlib.util.to_plain(result_dict), snapshot_pkl=snapshot_pkl, timestamp=time.time()))
    if run_dir is None:
        return None
    path = os.path.join(run_dir, f'metric-{metric}.jsonl')
    with open(path, 'ab', buffering=0) as f:
        dnnlib.util.append_text(f, line + '\n')  # A line is either all there or not at all (cut back if the disk is full).
    return path

#----------------------------------------------------------------------------
# The metrics. Paper protocols: CIFAR-10 50k vs. the 50k training images (fid50k_full) and 10k vs.
# the 10k test images (fid10k with --ref-data); STL-10 50k / 10k vs. the 100k unlabeled images
# (fid50k_full / fid10k_full); CelebA-HQ 30k vs. 30k (fid30k_full); LSUN Church 50k vs. 126k
# (fid50k_full); IS of 50k images in 10 splits (is50k). The authors' CelebA-HQ 128 config scores 3k generated
# images against the last 3k of the dataset (fid3k with --ref-data). L_D of the depth study: the largest
# input-gradient norm of D's score over 50k real and 50k generated images (lipschitz50k).


@register_metric
def fid50k_full(opts: features.MetricOptions) -> dict[str, float]:
    return dict(fid50k_full=frechet_inception_distance.compute_fid(opts, num_gen=50000))


@register_metric
def fid30k_full(opts: features.MetricOptions) -> dict[str, float]:
    return dict(fid30k_full=frechet_inception_distance.compute_fid(opts, num_gen=30000))


@register_metric
def fid10k_full(opts: features.MetricOptions) -> dict[str, float]:
    return dict(fid10k_full=frechet_inception_distance.compute_fid(opts, num_gen=10000))


@register_metric
def fid50k(opts: features.MetricOptions) -> dict[str, float]:
    return dict(fid50k=frechet_inception_distance.compute_fid(opts, num_gen=50000, use_ref_data=True))


@register_metric
def fid10k(opts: features.MetricOptions) -> dict[str, float]:
    return dict(fid10k=frechet_inception_distance.compute_fid(opts, num_gen=10000, use_ref_data=True))


@register_metric
def fid3k(opts: features.MetricOptions) -> dict[str, float]:
    return dict(fid3k=frechet_inception_distance.compute_fid(opts, num_gen=3000, use_ref_data=True))


@register_metric
def is50k(opts: features.MetricOptions) -> dict[str, float]:
    mean, std = inception_score.compute_is(opts, num_gen=50000, num_splits=10)
    return dict(is50k_mean=mean, is50k_std=std)


@register_metric
def kid50k_full(opts: features.MetricOptions) -> dict[str, float]:
    kid = kernel_inception_distance.compute_kid(opts, max_real=1000000, num_gen=50000, num_subsets=100,
                                                max_subset_size=1000)
    return dict(kid50k_full=kid)


@register_metric
def pr50k3_full(opts: features.MetricOptions) -> dict[str, float]:
    precision, recall = precision_recall.compute_pr(opts, max_real=200000, num_gen=50000, nhood_size=3,
                                                    batch_size=4096)
    return dict(pr50k3_full_precision=precision, pr50k3_full_recall=recall)


@register_metric
def lipschitz1k(opts: features.MetricOptions) -> dict[str, float]:
    return dict(lipschitz1k=lipschitz.compute_lipschitz(opts, num=1000))


@register_metric
def lipschitz50k(opts: features.MetricOptions) -> dict[str, float]:
    return dict(lipschitz50k=lipschitz.compute_lipschitz(opts, num=50000))
