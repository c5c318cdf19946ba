"""Registry of the named metrics, the entry point that evaluates one, and the report of its result.

A metric name fixes its protocol (how many generated images, which real images), so that numbers
with the same name are comparable: `fid50k_full` is always 50k generated images against the whole
training set. `calc_metric` accepts `num_gen` / `max_real` overrides for tests and quick looks; a
result computed with them records them, so it is never mistaken for the named protocol.
"""

from __future__ import annotations

import json
import os
import time
from typing import Callable

import torch

import dnnlib

from . import frechet_inception_distance, inception_score, kernel_inception_distance, metric_utils, precision_recall

#----------------------------------------------------------------------------

_metric_dict: dict[str, Callable[[metric_utils.MetricOptions], dict[str, float]]] = {}


def register_metric(fn: Callable[[metric_utils.MetricOptions], dict[str, float]]) -> Callable:
    """Decorator: the function's name becomes the metric's name; it returns {result name: value}."""
    _metric_dict[fn.__name__] = fn
    return fn


def is_valid_metric(metric: str) -> bool:
    return metric in _metric_dict


def list_valid_metrics() -> list[str]:
    return list(_metric_dict.keys())


def calc_metric(metric: str, G: torch.nn.Module, dataset_kwargs: dict, ref_dataset_kwargs: dict | None = None,
                num_gpus: int = 1, rank: int = 0, device: torch.device = torch.device('cpu'),
                detector_url: str | None = None, cache: bool = True, progress: Callable[[str], None] | None = None,
                mirror: bool = False, num_gen: int | None = None, max_real: int | None = None,
                num_workers: int | None = None) -> dnnlib.EasyDict:
    """Evaluate one metric of generator G; every process of a torch.distributed group calls it together.

    dataset_kwargs: the training set (reference of the `_full` metrics; label distribution of a
    conditional G); ref_dataset_kwargs: the reference split of `fid50k` / `fid10k`; detector_url: a
    TorchScript detector replacing each metric's default; cache: use the dataset statistics cache;
    progress: receives one-line messages on rank 0; mirror: add x-flipped real images (not the paper
    protocol); num_gen / max_real: override the protocol's image counts (tests, quick looks);
    num_workers: data loader worker processes (None = 3, or fewer on fewer CPUs).

    Returns EasyDict(results={name: value}, metric, total_time, total_time_str, num_gpus, plus any
    override used), with the same results on every rank. Raises DetectorUnavailableError when the
    detector cannot be fetched, ValueError for an unknown metric or missing data.
    """
    if not is_valid_metric(metric):
        raise ValueError(f'unknown metric "{metric}"; valid metrics: {", ".join(list_valid_metrics())}')
    opts = metric_utils.MetricOptions(G=G, dataset_kwargs=dataset_kwargs, ref_dataset_kwargs=ref_dataset_kwargs,
                                      num_gpus=num_gpus, rank=rank, device=device, detector_url=detector_url,
                                      cache=cache, progress=progress, mirror=mirror, num_gen=num_gen, max_real=max_real,
                                      num_workers=num_workers)
    start_time = time.time()
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
    overrides = dict(num_gen=num_gen, max_real=max_real, mirror=mirror or None, detector=detector_url)
    result.update({name: value for name, value in overrides.items() if value is not None})
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
    with open(path, 'at') as f:
        f.write(line + '\n')  # One write per line: a line is either all there or not at all.
    return path

#----------------------------------------------------------------------------
# The metrics. Paper protocols: CIFAR-10 50k vs. the 50k training images (fid50k_full) and 10k vs.
# the 10k test images (fid10k with --ref-data); STL-10 50k / 10k vs. the 100k unlabeled images
# (fid50k_full / fid10k_full); CelebA-HQ 30k vs. 30k (fid30k_full); LSUN Church 50k vs. 126k
# (fid50k_full); IS of 50k images in 10 splits (is50k).


@register_metric
def fid50k_full(opts: metric_utils.MetricOptions) -> dict[str, float]:
    return dict(fid50k_full=frechet_inception_distance.compute_fid(opts, num_gen=50000))


@register_metric
def fid30k_full(opts: metric_utils.MetricOptions) -> dict[str, float]:
    return dict(fid30k_full=frechet_inception_distance.compute_fid(opts, num_gen=30000))


@register_metric
def fid10k_full(opts: metric_utils.MetricOptions) -> dict[str, float]:
    return dict(fid10k_full=frechet_inception_distance.compute_fid(opts, num_gen=10000))


@register_metric
def fid50k(opts: metric_utils.MetricOptions) -> dict[str, float]:
    return dict(fid50k=frechet_inception_distance.compute_fid(opts, num_gen=50000, use_ref_data=True))


@register_metric
def fid10k(opts: metric_utils.MetricOptions) -> dict[str, float]:
    return dict(fid10k=frechet_inception_distance.compute_fid(opts, num_gen=10000, use_ref_data=True))


@register_metric
def is50k(opts: metric_utils.MetricOptions) -> dict[str, float]:
    mean, std = inception_score.compute_is(opts, num_gen=50000, num_splits=10)
    return dict(is50k_mean=mean, is50k_std=std)


@register_metric
def kid50k_full(opts: metric_utils.MetricOptions) -> dict[str, float]:
    kid = kernel_inception_distance.compute_kid(opts, max_real=1000000, num_gen=50000, num_subsets=100,
                                                max_subset_size=1000)
    return dict(kid50k_full=kid)


@register_metric
def pr50k3_full(opts: metric_utils.MetricOptions) -> dict[str, float]:
    precision, recall = precision_recall.compute_pr(opts, max_real=200000, num_gen=50000, nhood_size=3,
                                                    batch_size=4096)
    return dict(pr50k3_full_precision=precision, pr50k3_full_recall=recall)
