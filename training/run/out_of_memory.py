"""Out of GPU memory in one line: where, at which resolution and batch share, and the --batch-gpu that lowers it.

A CUDA out-of-memory error (torch.OutOfMemoryError) in a training step, or in the metric evaluation
at a snapshot (MetricOutOfMemory, from training/run/evaluation.py), leaves the training loop through
`explain_out_of_memory`, which turns it into OutOfMemory: one line naming the G step, the active
resolution, how many images each process handles at once of its share of the global batch, and a
--batch-gpu that halves that (the rest of the share becomes gradient accumulation: the same
training). Nothing is written on the way out, so the last snapshot is the last complete one.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from training.recipes import progressive
from training.recipes.schedule import StepPlan, split_batch

#----------------------------------------------------------------------------


class OutOfMemory(RuntimeError):
    """The run ran out of GPU memory; the message is one line for the user."""


class MetricOutOfMemory(RuntimeError):
    """Out of GPU memory while evaluating `metric` at a snapshot."""

    def __init__(self, metric: str) -> None:
        super().__init__(f'out of GPU memory evaluating {metric}')
        self.metric = metric


def smaller_batch_gpu(plan: StepPlan, num_gpus: int, group_size: int) -> int | None:
    """The largest --batch-gpu of at most half the images a process handles at once in `plan` (D or G step, whichever
    is more) that the schedule can split the shares into (whole minibatch-stddev groups of `group_size`); None if
    there is none."""
    at_once = max(plan.batch_gpu_D, plan.batch_gpu_G)
    for cap in range(at_once // 2, 0, -1):
        try:
            if max(split_batch(plan.batch_D, num_gpus, cap, group_size), split_batch(plan.batch_G, num_gpus, cap, group_size)) < at_once:
                return cap
        except ValueError:  # No split into whole groups at this cap.
            continue
    return None


def out_of_memory_message(experiment: Any, step: int, cur_nimg: int, metric: str | None = None) -> str:
    """The line of an out-of-memory error of `experiment` (training/experiment.py) in G step `step` + 1 (or, with
    `metric`, in the evaluation of that metric after G step `step`), `cur_nimg` real images into the run."""
    schedule = experiment.schedule
    plan = schedule.plan(step, cur_nimg)
    resolution = experiment.resolution if plan.lod is None else progressive.lod_to_resolution(plan.lod, experiment.resolution)
    at_once, share = max(plan.batch_gpu_D, plan.batch_gpu_G), max(plan.share_D, plan.share_G)
    where = f'in G step {step + 1}' if metric is None else f'evaluating {metric} after G step {step}'
    line = (f'out of GPU memory {where} at {resolution}x{resolution}: each of the {experiment.gpus} process(es) handles '
            f'{at_once} images at once of its share of {share} (global batch {max(plan.batch_D, plan.batch_G)})')
    smaller = smaller_batch_gpu(plan, experiment.gpus, schedule.group_size)
    if smaller is None:
        line += '; that is the fewest this schedule can take at once: it needs a GPU with more memory'
    else:
        line += (f'; --batch-gpu={smaller} lowers the memory (the rest of the share accumulates: the same training); '
                 f'continue from the last snapshot with --resume=latest --batch-gpu={smaller}')
    if metric is not None:
        line += ', or train with --metrics=none and evaluate the snapshots with calc_metrics.py'
    return line + '; the snapshots written so far are complete'


@contextlib.contextmanager
def explain_out_of_memory(experiment: Any, state: Any) -> Iterator[None]:
    """Turn an out-of-memory error inside the block into OutOfMemory, at the position of `state` (the run state,
    training/run/run_state.py)."""
    try:
        yield
    except (torch.OutOfMemoryError, MetricOutOfMemory) as e:
        metric = e.metric if isinstance(e, MetricOutOfMemory) else None
        raise OutOfMemory(out_of_memory_message(experiment, state.step, state.cur_nimg, metric)) from None
