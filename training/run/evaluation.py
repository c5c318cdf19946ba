"""Metrics of a run at its snapshots.

At every snapshot `MetricEvaluator.evaluate()` computes each metric on G_ema (all processes
together, metrics/metric_main.py), appends the results to metric-<name>.jsonl (process 0; one that cannot be written
waits, with `deferred`, until the snapshot has been: training/run/write_failure.py), and
returns them as statistics ('Metrics/<result>': {num, mean, std}) for stats.jsonl and as values,
from which the run state keeps the best (training/run/run_state.py). A detector that cannot be had (no network, a bad
path) costs the run its metrics, with one warning, not the run itself. The metrics run with TF32 off
whatever the run's --precision (metric_main.calc_metric), so that a snapshot's FID does not depend on it.
A stop signal abandons the evaluation after the batch in progress (training/run/stop_signal.py: the
metrics done are kept); out of GPU memory becomes MetricOutOfMemory, which training/run/out_of_memory.py
explains in one line.
"""

from __future__ import annotations

import contextlib
import os
from typing import Callable

import torch

import dnnlib
from training.run.out_of_memory import MetricOutOfMemory
from training.run.stop_signal import StopRequested, StopSignal
from training.run.write_failure import Deferred

#----------------------------------------------------------------------------


class MetricEvaluator:
    """The run's metrics at each snapshot (see the module docstring)."""

    def __init__(self,
        metrics: list[str],                 # Metric names (metrics/metric_main.py), evaluated in this order.
        metric_kwargs: dict,                # Extra arguments of metric_main.calc_metric (reference data, detectors).
        dataset_kwargs: dict,               # The training data, the reference of the *_full metrics.
        run_dir: str,                       # Where metric-<name>.jsonl goes.
        num_gpus: int,                      # Processes sharing the work...
        rank: int,                          # ...and this one.
        device: torch.device,
        log: Callable[[str], None],         # Progress and warnings (process 0).
        stop: StopSignal | None = None,     # The run's stop request, which abandons an evaluation.
        deferred: Deferred | None = None,   # Keeps a result that cannot be written until the snapshot is (None: raised at once).
    ) -> None:
        self.metrics = list(metrics)
        self.metric_kwargs, self.dataset_kwargs, self.run_dir = metric_kwargs, dataset_kwargs, run_dir
        self.num_gpus, self.rank, self.device, self.log, self.stop = num_gpus, rank, device, log, stop
        self.deferred = deferred

    def evaluate(self, G_ema: torch.nn.Module, snapshot_pkl: str,
                 D: torch.nn.Module | None = None) -> tuple[dict, dict[str, float]]:
        """Statistics of every metric on G_ema ('Metrics/<result>': {num, mean, std}), and the results (name -> value);
        D: the discriminator, for the metrics of its gradients (L_D)."""
        from metrics import detectors, metric_main
        results, entries = {}, {}
        for metric in self.metrics:
            try:
                result = metric_main.calc_metric(metric=metric, G=G_ema, dataset_kwargs=self.dataset_kwargs,
                                                 num_gpus=self.num_gpus, rank=self.rank, device=self.device,
                                                 progress=self.log, interrupt=None if self.stop is None else self.stop.interrupt,
                                                 D=D, **self.metric_kwargs)
            except detectors.DetectorUnavailableError as e:
                self.log(f'Warning: {e}; training continues without metrics')
                self.metrics = []
                return {}, {}
            except StopRequested:
                self.log(f'Evaluation of {metric} abandoned: stop requested by {self.stop.signal_name}')
                break
            except torch.OutOfMemoryError:
                raise MetricOutOfMemory(metric) from None
            if self.rank == 0:
                path = os.path.join(self.run_dir, f'metric-{metric}.jsonl')
                with self.deferred.guard() if self.deferred else contextlib.nullcontext(), dnnlib.util.writing(path):
                    metric_main.report_metric(result, run_dir=self.run_dir, snapshot_pkl=snapshot_pkl)
            results.update(result.results)
        for name, value in results.items():
            entries[f'Metrics/{name}'] = dnnlib.EasyDict(num=1, mean=value, std=0.0)
        return entries, results
