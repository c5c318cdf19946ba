"""Where a run is, and the snapshot that lets another process continue it bit for bit.

`RunState` holds what the networks and optimizers do not: the counters (G steps, real images shown,
ticks, and the images at the start of the current tick), the position in the real-image stream, the
best metric value so far, and the random streams of every process (torch's, CUDA's, and the numpy
generator of the fakes' labels). A snapshot (torch_utils/persistence.py: plain data, safe to load) is

    G, D, G_ema                 the networks (class name, constructor kwargs, tensors)
    G_opt_state, D_opt_state    the optimizers' state dicts
    progress                    step, cur_nimg, cur_tick, tick_start_nimg, consumed, best_metric, best
    rng_states                  one {torch, cuda, labels} per process
    loss_states                 one loss state_dict per process (StyleGAN2's path length average; absent in snapshots
                                written before it was kept, whose resumed runs start it at 0; with --aug, the
                                augmentation's p and ADA's statistic: training/step/ada.py)
    training_set_kwargs         the data it was trained on
    experiment                  the run's Experiment as plain data (training/experiment.py), which a
                                resumed run takes unless told otherwise

REQUIRED_KEYS are what a resumed run needs; train.py refuses any other file with that list. On
resume, random streams restart from the seed when the process count differs (they are per process), and every process
takes the mean of the saved loss states.
A snapshot may be taken between ticks (on a stop signal, training/run/stop_signal.py): with the
start of its tick recorded, the resumed run ends that tick, and writes its snapshots, at the same
kimg as a run that was never stopped.
"""

from __future__ import annotations

import copy
from typing import Callable

import numpy as np
import torch

import dnnlib
from torch_utils import misc, persistence
from training.step import LOSS_STATE_KEYS, GANLoss, portable_state_dict

#----------------------------------------------------------------------------

NETWORKS = ('G', 'D', 'G_ema')
OPTIMIZERS = ('G_opt', 'D_opt')
REQUIRED_KEYS = NETWORKS + tuple(f'{name}_state' for name in OPTIMIZERS) + ('progress', 'rng_states')


def load_resumable(path: str) -> dnnlib.EasyDict:
    """A snapshot that a run can continue from: persistence.UnsafeSnapshotError or OSError when it cannot be loaded,
    ValueError (one line) when it lacks REQUIRED_KEYS (it was not written by train.py)."""
    snapshot = persistence.load_snapshot(path)
    missing = [key for key in REQUIRED_KEYS if key not in snapshot]
    if missing:
        raise ValueError(f'{path} lacks {", ".join(missing)}; only snapshots written by train.py '
                         f'(network-snapshot-*.pkl) can be resumed')
    loss_states = snapshot.get('loss_states', [])
    if not isinstance(loss_states, list) or not all(
            isinstance(s, dict) and 'pl_mean' in s and set(s) <= set(LOSS_STATE_KEYS)
            and all(torch.is_tensor(v) and v.shape == () and v.is_floating_point() for v in s.values())
            for s in loss_states):
        raise ValueError(f'{path}: loss_states must be a list of {{{", ".join(LOSS_STATE_KEYS)}}} scalars (pl_mean and '
                         f'those of --aug), one per process')
    return snapshot


def snapshot_label(cur_nimg: int) -> str:
    """kimg label of file names: '000064', or '000064.128' when the images are not whole thousands
    (short ticks would otherwise give several snapshots the same name)."""
    return f'{cur_nimg // 1000:06d}' + (f'.{cur_nimg % 1000:03d}' if cur_nimg % 1000 else '')


class RunState:
    """Counters, data position, best metric and random streams of one process of a run."""

    def __init__(self,
        seed: int,                          # The run's seed; process `rank` seeds its streams with seed * num_gpus + rank.
        num_gpus: int,                      # Processes of the run.
        rank: int,                          # This process.
        device: torch.device,               # Whose CUDA random state is saved (when CUDA).
        best_metric: str | None = None,     # Metric (lower is better) whose best value is kept.
    ) -> None:
        self.num_gpus, self.rank, self.device, self.best_metric = num_gpus, rank, device, best_metric
        self.step = 0           # G steps done.
        self.cur_nimg = 0       # Real images shown to D, all processes together.
        self.cur_tick = 0       # Progress lines printed.
        self.tick_start_nimg = 0  # cur_nimg when the current tick began (the reporter moves it on).
        self.resume_position = 0  # Real images this process had taken from its stream when the run resumed.
        self.best = None        # Lowest value of best_metric so far.
        self.saved_step = None  # G step of the last snapshot written or resumed from...
        self.last_snapshot = None  # ...and the last one written (None: none yet).
        misc.set_seed(seed * num_gpus + rank)
        self.label_rng = np.random.default_rng(seed * num_gpus + rank)

    def record_metric(self, results: dict[str, float]) -> bool:
        """Keep best_metric's value from `results` (name -> value) if it is the lowest yet; True if it is."""
        value = results.get(self.best_metric)
        if value is None or (self.best is not None and not value < self.best):
            return False
        self.best = value
        return True

    def _rng_state(self) -> dict:
        return dict(torch=torch.get_rng_state(), labels=self.label_rng.bit_generator.state,
                    cuda=torch.cuda.get_rng_state(self.device) if self.device.type == 'cuda' else None)

    def snapshot(self, nets: dict[str, torch.nn.Module], optimizers: dict[str, torch.optim.Optimizer], loss: GANLoss,
                 consumed: int, training_set_kwargs: dict, experiment: dict | None = None) -> dict:
        """Everything a resumed run needs, `consumed` being the images this process has taken from its real-image
        stream (every process calls this: the random states and loss states are gathered)."""
        per_process = [(self._rng_state(), loss.state_dict())] * self.num_gpus
        if self.num_gpus > 1:
            torch.distributed.all_gather_object(per_process, per_process[0])
        return dict(**{name: nets[name] for name in NETWORKS},
                    **{f'{name}_state': portable_state_dict(optimizers[name]) for name in OPTIMIZERS},
                    training_set_kwargs=dnnlib.util.to_plain(training_set_kwargs),
                    rng_states=[rng for rng, _ in per_process], loss_states=[losses for _, losses in per_process],
                    experiment=dnnlib.util.to_plain(experiment or {}),
                    progress=dict(step=self.step, cur_nimg=self.cur_nimg, cur_tick=self.cur_tick,
                                  tick_start_nimg=self.tick_start_nimg, consumed=consumed,
                                  best_metric=self.best_metric, best=self.best))

    def save(self, paths: list[str], data: dict) -> None:
        """Write the snapshot `data` to every path (process 0 only; each write is atomic; dnnlib.util.WriteError when one
        cannot be written, which leaves the paths before it written: training/run/write_failure.py)."""
        if self.rank == 0:
            for path in paths:
                with dnnlib.util.writing(path):
                    persistence.save_snapshot(path, data)
        self.saved_step, self.last_snapshot = self.step, paths[0]

    def resume(self, snapshot: dict, nets: dict[str, torch.nn.Module], optimizers: dict[str, torch.optim.Optimizer],
               loss: GANLoss, log: Callable[[str], None]) -> None:
        """Continue from a loaded snapshot: networks, optimizer states, the loss's state, progress and random streams."""
        for name in NETWORKS:
            misc.copy_params_and_buffers(snapshot[name], nets[name], require_all=True)
        for name in OPTIMIZERS:
            # A copy: load_state_dict keeps the given tensors where their device and dtype match, and the
            # snapshot's tensors are shared memory when processes were spawned with it (train.py --gpus on a
            # CPU): without the copy every process would step the same Adam moments and counters in place.
            optimizers[name].load_state_dict(copy.deepcopy(snapshot[f'{name}_state']))
        progress = snapshot['progress']
        self.step, self.cur_nimg, self.cur_tick = progress['step'], progress['cur_nimg'], progress['cur_tick']
        self.tick_start_nimg = progress.get('tick_start_nimg', self.cur_nimg)  # Older snapshots: taken at a tick's end.
        self.saved_step = self.step
        self.resume_position = progress['consumed']
        self.best = progress['best'] if progress['best_metric'] == self.best_metric else None
        loss_states = snapshot.get('loss_states')
        if loss_states:
            own = len(loss_states) == self.num_gpus
            loss.load_state_dict(loss_states[self.rank] if own else
                                 {key: torch.stack([s[key] for s in loss_states]).mean(0) for key in loss_states[0]})
        rng_states = snapshot['rng_states']
        if len(rng_states) != self.num_gpus:
            log(f'Warning: the snapshot was written by {len(rng_states)} processes, this run has {self.num_gpus}; '
                f'random streams restart from the seed')
            return
        state = rng_states[self.rank]
        torch.set_rng_state(state['torch'])
        if self.device.type == 'cuda' and state['cuda'] is not None:
            torch.cuda.set_rng_state(state['cuda'], self.device)
        self.label_rng.bit_generator.state = state['labels']
