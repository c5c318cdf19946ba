"""What a run shows while it trains: progress lines, statistics, image grids, and the divergence stop.

At every tick (kimg_per_tick thousand real images) `TickReporter.tick()`

    gathers the statistics reported since the last tick (torch_utils/training_stats.py, all processes),
    stops the run (TrainingDiverged, one line) if a gradient became NaN/Inf since the last tick:
        the first such G step and network, from the updaters' device-side flags, and the loss terms
        that were non-finite; with fp16 (overflowing steps are skipped) a non-finite weight instead,
    prints the progress line (kimg to the image, as snapshot names give it; share done, ETA, phase of progressive
        growing with its lod, the augmentation probability p of --aug, sec/kimg, time spent on grids/snapshots/metrics,
        memory, losses; on a CPU, 'starved' when
        more threads want to run than there are cores: torch_utils/threads.py),
    starts the next tick (the run state's tick_start_nimg, which a snapshot records: a run resumed
        between ticks ends its tick where the stopped one would have),
and `end_tick()` appends the statistics to stats.jsonl and TensorBoard (when installed) and, at a
snapshot, redraws progress.png, the losses and metrics against kimg (training/run/charts.py). A file that
cannot be written raises dnnlib.util.WriteError (training/run/write_failure.py). `ImageGrids` writes reals.png once
and fakes<kimg>.png of G_ema on fixed latents (one row per class for conditional data).
Everything is written by process 0; the others only take part in the collective operations.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

import numpy as np
import psutil
import torch

import dnnlib
from torch_utils import misc, threads, training_stats
from training.run.charts import write_progress_chart
from training.step import NEVER, NetworkUpdater

#----------------------------------------------------------------------------


class TrainingDiverged(RuntimeError):
    """A loss or a gradient became NaN or Inf: the run stops, keeping its last finite snapshot."""


DIVERGENCE_ADVICE = ('the last snapshot written before it is the last finite one; to go on, resume from it with '
                     '--precision=fp32 --resume-override if the run was fp16 or bf16, or start again with another --seed')

#----------------------------------------------------------------------------


def grid_layout(dataset: Any, max_images: int) -> tuple[tuple[int, int], np.ndarray]:
    """Grid size and labels of the image grids: one row per class (up to 16) for conditional data,
    else about `max_images` tiles, at most 1024 pixels wide."""
    gw = int(np.clip(1024 // dataset.resolution, 4, 16))
    if dataset.label_dim == 0:
        gh = max(max_images // gw, 1)
        return (gw, gh), np.zeros([gw * gh, 0], dtype=np.float32)
    gh = min(dataset.label_dim, 16)
    labels = np.zeros([gw * gh, dataset.label_dim], dtype=np.float32)
    labels[np.arange(gw * gh), np.arange(gw * gh) // gw] = 1
    return (gw, gh), labels


def grid_reals(dataset: Any, grid_labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random real images for the grid's tiles, uint8 [N, C, H, W]: with labels, each of its tile's class."""
    if grid_labels.shape[1] == 0:
        indices = rng.integers(len(dataset), size=len(grid_labels))
    else:
        classes = np.array([dataset.get_label(i).argmax() for i in range(len(dataset))])
        pools = [np.flatnonzero(classes == k) for k in range(grid_labels.shape[1])]
        indices = [rng.choice(pools[k]) if len(pools[k]) else rng.integers(len(dataset)) for k in grid_labels.argmax(axis=1)]
    return np.stack([dataset[int(i)][0] for i in indices])


class ImageGrids:
    """reals.png, and fakes<label>.png of G_ema on latents and labels fixed by the seed."""

    def __init__(self, run_dir: str, dataset: Any, z_dim: int, seed: int, device: torch.device) -> None:
        rng = np.random.default_rng(seed)
        self.run_dir = run_dir
        self.grid_size, labels = grid_layout(dataset, max_images=64)
        self.z = torch.from_numpy(rng.standard_normal([labels.shape[0], z_dim])).float().to(device)
        self.c = torch.from_numpy(labels).to(device)
        with dnnlib.util.writing(path := os.path.join(run_dir, 'reals.png')):
            misc.save_image_grid(grid_reals(dataset, labels, rng) / 127.5 - 1, path, self.grid_size)

    @torch.no_grad()
    def save(self, G_ema: torch.nn.Module, label: str) -> str:
        fakes = torch.cat([G_ema(z, c) for z, c in zip(self.z.split(16), self.c.split(16))])
        path = os.path.join(self.run_dir, f'fakes{label}.png')
        with dnnlib.util.writing(path):
            misc.save_image_grid(fakes, path, self.grid_size)
        return path

#----------------------------------------------------------------------------


class TickReporter:
    """Progress lines, statistics and the divergence stop of a run (see the module docstring)."""

    def __init__(self,
        run_dir: str,                       # Where stats.jsonl, TensorBoard events and the chart go.
        schedule: Any,                      # The run's schedule (training/recipes/schedule.py): progress, phases, lod.
        state: Any,                         # The run state (training/run/run_state.py) at the start of this session.
        kimg_per_tick: float,               # A tick every this many thousand real images.
        start_time: float,                  # When the process started (time.time()).
        device: torch.device,               # GPU memory is reported for CUDA.
        log: Callable[[str], None],         # Prints a line (on process 0).
    ) -> None:
        self.run_dir, self.schedule, self.kimg_per_tick, self.device, self.log = run_dir, schedule, kimg_per_tick, device, log
        self.rank = misc.rank()
        self.collector = training_stats.Collector(regex='.*')
        self.stats_jsonl = self.tb_writer = None
        if self.rank == 0:
            self.stats_jsonl = open(os.path.join(run_dir, 'stats.jsonl'), 'ab', buffering=0)  # Lines by dnnlib.util.append_text.
            try:
                import torch.utils.tensorboard as tensorboard
                self.tb_writer = tensorboard.SummaryWriter(run_dir)
            except ImportError:
                pass
        self.start_time = start_time
        # Timed from here: a run resumed between ticks times only the part of the tick it trained.
        self.timed_nimg, self.tick_start_step, self.tick_start_time = state.cur_nimg, state.step, time.time()
        self.session_start_time, self.session_start_progress = self.tick_start_time, schedule.progress(state.step, state.cur_nimg)
        self.maintenance_time = self.tick_start_time - start_time
        self.maintenance_start = self.tick_start_time
        if device.type == 'cuda':
            torch.cuda.reset_peak_memory_stats()

    def tick_due(self, state: Any) -> bool:
        """Whether the current tick, begun at state.tick_start_nimg, is complete."""
        return state.cur_nimg >= state.tick_start_nimg + self.kimg_per_tick * 1000

    def tick(self, updaters: list[NetworkUpdater], state: Any, done: bool,
             augment_p: torch.Tensor | None = None) -> dnnlib.EasyDict:
        """Statistics of the tick; raises TrainingDiverged; prints the progress line (see the module docstring).
        `augment_p`: the augmentation probability of --aug=ada|fixed, read once here (Progress/augment)."""
        bad_steps = torch.stack([u.first_bad_step for u in updaters])
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(bad_steps, op=torch.distributed.ReduceOp.MIN)
        self.collector.update()
        stats = self.collector.as_dict()
        self._check_divergence(updaters, bad_steps.tolist(), state.step)

        now = time.time()
        sec_per_kimg = (now - self.tick_start_time) / max((state.cur_nimg - self.timed_nimg) / 1000, 1e-8)
        done_share = self.schedule.progress(state.step, state.cur_nimg)
        eta = (now - self.session_start_time) * (1 - done_share) / max(done_share - self.session_start_progress, 1e-12)
        lod = self.schedule.plan(state.step, state.cur_nimg).lod  # Of the phase now, which phase_label names.
        for name, value in [('Progress/tick', state.cur_tick), ('Progress/step', state.step), ('Progress/kimg', state.cur_nimg / 1000),
                            ('Timing/sec_per_kimg', sec_per_kimg)] + ([('Progress/lod', lod)] if lod is not None else []) \
                + ([('Progress/augment', float(augment_p))] if augment_p is not None else []):
            stats[name] = dnnlib.EasyDict(num=1, mean=float(value), std=0.0)
        fields = [f'tick {state.cur_tick:<4d}', f'step {state.step:<7d}', f'kimg {state.cur_nimg / 1000:<9.3f}',
                  f'done {100 * done_share:5.1f}%', f'ETA {dnnlib.util.format_time(eta) if not done else "-":<11s}']
        phase_label = self.schedule.phase_label(state.step, state.cur_nimg)
        if phase_label is not None:
            fields += [f'phase {phase_label:<18s}', f'lod {lod:<5.2f}']
        if augment_p is not None:
            fields += [f'augment {stats["Progress/augment"].mean:<5.3f}']
        fields += [f'time {dnnlib.util.format_time(now - self.start_time):<12s}', f'sec/kimg {sec_per_kimg:<7.2f}',
                   f'maintenance {self.maintenance_time:<5.1f}',
                   f'cpumem {psutil.Process(os.getpid()).memory_info().rss / 2**30:<5.2f}']
        if self.device.type == 'cuda':
            fields += [f'gpumem {torch.cuda.max_memory_allocated(self.device) / 2**30:<5.2f}']
            torch.cuda.reset_peak_memory_stats()
        elif (busy := threads.contention()) is not None:  # Other programs compete for the cores.
            fields += [f'starved ({busy})']
        fields += [f'{short} {stats[name].mean:<7.3f}' for name, short in [('Loss/D/loss', 'loss_D'), ('Loss/G/loss', 'loss_G')]
                   if name in stats]
        self.log(' '.join(fields))
        self.maintenance_start = time.time()
        state.tick_start_nimg = state.cur_nimg  # The next tick begins here; the snapshot of this tick records it.
        return stats

    def _check_divergence(self, updaters: list[NetworkUpdater], bad_steps: list[int], step: int) -> None:
        bad_losses = [name for name in self.collector.nonfinite_names() if name.startswith(('Loss/D/', 'Loss/G/'))]
        bad_weights = [f'{u.net}.{t}' for u in updaters if (t := misc.find_nonfinite(u.module)) is not None]
        if min(bad_steps) != NEVER:
            net = updaters[int(np.argmin(bad_steps))].net
            where = f'at G step {min(bad_steps)}: non-finite gradient of {net}'
        elif bad_weights:  # fp16: overflowing steps are skipped (their losses may be NaN); broken weights are not.
            net = bad_weights[0][0]
            where = f'between G steps {self.tick_start_step + 1} and {step}: non-finite weight {bad_weights[0]}'
        else:
            return
        terms = [name for name in bad_losses if name.startswith(f'Loss/{net}/')]
        raise TrainingDiverged(f'training diverged {where}{" (loss terms: " + ", ".join(terms) + ")" if terms else ""}; '
                               f'{DIVERGENCE_ADVICE}')

    def end_tick(self, stats: dict, state: Any, chart: bool) -> None:
        """Append the tick's statistics to stats.jsonl and TensorBoard; redraw progress.png if `chart`."""
        if self.rank == 0:
            dnnlib.util.append_text(self.stats_jsonl, json.dumps(dict(stats, timestamp=time.time())) + '\n')
            if self.tb_writer is not None:
                for name, value in stats.items():
                    self.tb_writer.add_scalar(name, value.mean, global_step=int(state.cur_nimg / 1000))
                self.tb_writer.flush()
            if chart:
                with dnnlib.util.writing(path := os.path.join(self.run_dir, 'progress.png')):
                    write_progress_chart(self.stats_jsonl.name, path)
        self.timed_nimg, self.tick_start_step, self.tick_start_time = state.cur_nimg, state.step, time.time()
        self.maintenance_time = self.tick_start_time - self.maintenance_start

    def __enter__(self) -> TickReporter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        if self.stats_jsonl is not None:
            self.stats_jsonl.close()
        if self.tb_writer is not None:
            self.tb_writer.close()
