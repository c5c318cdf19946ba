"""The training loop: the paper's alternating D/G updates, with logging, snapshots and metrics.

One iteration is one generator update ("G step", the unit the paper counts in). The run's schedule
(training/schedule.py) says, before every G step, what it uses:

    for each G step, until the schedule says done:
        plan <- schedule(step, images shown)     # batches M / M_G, rounds, lr, EMA beta, lod, phase
        if plan.phase changed: reset Adam         # StyleGAN v1: every new level of detail
        repeat n_dis times:                       # discriminator updates
            x ~ data (M), flipped at random (xflip); z ~ N(0, I) (M)
            minimize L_D(f_hat(x), f_hat(G(z)))   # f_hat = GN-normalized D, see training/gradnorm.py
        z ~ N(0, I) (M_G)
        minimize L_G(f_hat(G(z)))
        G_ema <- beta * G_ema + (1 - beta) * G

Each "minimize" is one Adam step on the gradient of the batch mean. The batch is global: every
process (one per GPU, or gloo on a CPU) takes its share of disjoint data, in accumulation rounds
when the share exceeds --batch-gpu, and the processes average their gradients before the step.

Every tick (kimg_per_tick thousand images) prints progress and an ETA and stops the run if a
gradient became NaN/Inf since the last tick; every few ticks it writes an image grid, evaluates
the metrics and writes a snapshot holding everything a resumed run needs to continue bit for bit.
"""

from __future__ import annotations

import copy
import json
import os
import time
from typing import Any, Iterator

import numpy as np
import psutil
import torch

import dnnlib
from torch_utils import misc, persistence, training_stats
from training import progressive
from training.loss import set_matmul_precision

#----------------------------------------------------------------------------
# Data.


class InfiniteSampler(torch.utils.data.Sampler):
    """Endless shuffled stream of dataset indices; process `rank` gets every `num_replicas`-th one.

    Each pass over the data uses a new permutation, so processes see disjoint images within a
    pass and every image is visited once per pass over all processes.
    """

    def __init__(self, dataset_size: int, rank: int = 0, num_replicas: int = 1, seed: int = 0, start: int = 0) -> None:
        if dataset_size <= 0:
            raise ValueError('The dataset is empty')
        self.dataset_size = dataset_size
        self.rank = rank
        self.num_replicas = num_replicas
        self.seed = seed
        self.start = start  # Position in the stream of all processes to start at (a resumed run's).

    def __iter__(self) -> Iterator[int]:
        rng = np.random.default_rng(self.seed)
        position = 0
        for _ in range(self.start // self.dataset_size):  # Skip whole passes: same permutations drawn.
            rng.permutation(self.dataset_size)
            position += self.dataset_size
        while True:
            for idx in rng.permutation(self.dataset_size):
                if position >= self.start and position % self.num_replicas == self.rank:
                    yield int(idx)
                position += 1


class RealImageStream:
    """Batches of real images (float in [-1, 1], on the device) and their labels, of any size.

    The DataLoader delivers fixed chunks; a batch of another size (the progressive schedule
    changes it with the resolution) is assembled from as many chunks as it needs. `consumed`
    counts the images handed out; a stream started with `consumed=k` continues the one that had
    handed out k images (every process consumes alike, so the shared sampler position is k * num_replicas).
    """

    def __init__(self, dataset: Any, chunk: int, rank: int, num_replicas: int, seed: int, device: torch.device,
                 num_workers: int, consumed: int = 0) -> None:
        sampler = InfiniteSampler(len(dataset), rank=rank, num_replicas=num_replicas, seed=seed,
                                  start=consumed * num_replicas)
        # Its own generator: starting the loader must not draw from the global RNG that a resume restores.
        loader = torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=chunk, num_workers=num_workers,
                                             generator=torch.Generator().manual_seed(seed),
                                             pin_memory=device.type == 'cuda',
                                             persistent_workers=num_workers > 0, prefetch_factor=2 if num_workers > 0 else None)
        self._iterator = iter(loader)
        self._device = device
        self._img: list[torch.Tensor] = []
        self._c: list[torch.Tensor] = []
        self._count = 0
        self.consumed = consumed

    def next(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._count == 0:
            img, c = next(self._iterator)
            if img.shape[0] == batch:  # The usual case: one chunk is one batch, nothing to copy.
                self.consumed += batch
                return self._to_device(img, c)
            self._img, self._c, self._count = [img], [c], img.shape[0]
        while self._count < batch:
            img, c = next(self._iterator)
            self._img.append(img)
            self._c.append(c)
            self._count += img.shape[0]
        img, c = torch.cat(self._img), torch.cat(self._c)
        self._img, self._c, self._count = [img[batch:]], [c[batch:]], img.shape[0] - batch
        self.consumed += batch
        return self._to_device(img[:batch], c[:batch])

    def _to_device(self, img: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        img = img.to(self._device, non_blocking=True).to(torch.float32) / 127.5 - 1
        return img, c.to(self._device, non_blocking=True)


def random_xflip(img: torch.Tensor) -> torch.Tensor:
    """Mirror each image left-right with probability 1/2 (the paper's flips of real images)."""
    flip = torch.rand(img.shape[0], 1, 1, 1, device=img.device) < 0.5
    return torch.where(flip, img.flip(3), img)


def sample_labels(dataset: Any, n: int, rng: np.random.Generator, device: torch.device) -> torch.Tensor:
    """Labels for generated images, drawn from the label distribution of the training set."""
    if dataset.label_dim == 0:
        return torch.zeros(n, 0, device=device)
    idx = rng.integers(len(dataset), size=n)
    return torch.from_numpy(np.stack([dataset.get_label(int(i)) for i in idx])).to(device)

#----------------------------------------------------------------------------
# Image grids.


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


#----------------------------------------------------------------------------
# Optimization helpers.


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group['lr'] = lr


def reset_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Forget Adam's moments and step counts (StyleGAN v1 does this at every new level of detail)."""
    optimizer.state.clear()


@torch.no_grad()
def update_ema(G_ema: torch.nn.Module, G: torch.nn.Module, beta: float) -> None:
    """G_ema <- beta * G_ema + (1 - beta) * G for parameters; buffers (BN statistics, w_avg, lod) are copied."""
    # One fused kernel per list (torch's own swa_utils and optimizers use these foreach ops).
    torch._foreach_lerp_(list(G_ema.parameters()), list(G.parameters()), 1 - beta)
    torch._foreach_copy_(list(G_ema.buffers()), list(G.buffers()))


def split_round(x: torch.Tensor, round_idx: int, rounds: int, group_size: int = 1) -> torch.Tensor:
    """Samples of accumulation round `round_idx` out of a process's batch x, keeping D's sample groups whole.

    StyleGAN's minibatch stddev groups samples i, i + N/G, i + 2N/G, ... of a batch of N (G = group
    size). Viewing x as [G, N/G, ...], round r takes columns [r * n/G, (r+1) * n/G) (n = N / rounds):
    whole groups, laid out so that the round's own stddev layer forms exactly those groups. With
    group_size 1 this is the r-th contiguous slice.
    """
    if rounds == 1:
        return x
    n = x.shape[0] // rounds
    g = min(group_size, n)
    cols = n // g
    return x.reshape(g, x.shape[0] // g, *x.shape[1:])[:, round_idx * cols:(round_idx + 1) * cols].reshape(n, *x.shape[1:])


def grad_norm(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """Total L2 norm of the parameters' gradients, on the device (no host sync)."""
    grads = [p.grad for p in params if p.grad is not None]
    return torch.stack(torch._foreach_norm(grads)).norm() if grads else torch.zeros([])


NEVER = np.iinfo(np.int64).max  # "No step yet" in first_bad_step.


class TrainingDiverged(RuntimeError):
    """A loss or a gradient became NaN or Inf: the run stops, keeping its last finite snapshot."""


def snapshot_label(cur_nimg: int) -> str:
    """kimg label of file names: '000064', or '000064.128' when the images are not whole thousands
    (short ticks would otherwise give several snapshots the same name)."""
    return f'{cur_nimg // 1000:06d}' + (f'.{cur_nimg % 1000:03d}' if cur_nimg % 1000 else '')

#----------------------------------------------------------------------------


def training_loop(
    run_dir: str = '.',                      # Output directory.
    training_set_kwargs: dict = {},          # Dataset: class_name + kwargs.
    G_kwargs: dict = {},                     # Generator: class_name + kwargs (c_dim, img_resolution, img_channels included).
    D_kwargs: dict = {},                     # Discriminator, likewise.
    G_opt_kwargs: dict = {},                 # Generator optimizer: class_name + kwargs.
    D_opt_kwargs: dict = {},                 # Discriminator optimizer.
    loss_kwargs: dict = {},                  # Loss (training.loss.GANLoss): adversarial loss, D constraint, CR.
    schedule_kwargs: dict = {},              # Run schedule (training/schedule.py): batches, rounds, lr, EMA, lod, length.
    xflip: bool = True,                      # Mirror each real image left-right with probability 1/2.
    random_seed: int = 0,                    # Global seed.
    num_gpus: int = 1,                       # Number of processes.
    rank: int = 0,                           # This process.
    num_workers: int = 2,                    # DataLoader worker processes per process.
    kimg_per_tick: float = 4,                # Progress is printed every this many thousand real images.
    image_snapshot_ticks: int | None = 50,   # Image grids every this many ticks (None = never).
    network_snapshot_ticks: int | None = 50, # Snapshots (and metrics) every this many ticks; always one at the end.
    metrics: list[str] = [],                 # Metrics evaluated at every snapshot.
    metric_kwargs: dict = {},                # Extra arguments of metric_main.calc_metric (reference data, detectors).
    best_metric: str | None = None,          # Metric (lower is better) that picks network-best.pkl; None = none kept.
    resume_pkl: str | None = None,           # Snapshot to continue from.
) -> None:
    """Train G and D on `training_set_kwargs` by the algorithm in the module docstring; write everything into `run_dir`."""
    # Initialize.
    start_time = time.time()
    device = torch.device('cuda', torch.cuda.current_device()) if torch.cuda.is_available() else torch.device('cpu')
    if device.type == 'cuda':
        torch.backends.cudnn.benchmark = True
    set_matmul_precision(loss_kwargs.get('precision', 'fp32'))  # TF32 or strict fp32 matmuls, process-wide.
    misc.set_seed(random_seed * num_gpus + rank)
    label_rng = np.random.default_rng(random_seed * num_gpus + rank)
    log = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)

    # Load dataset.
    training_set = dnnlib.util.construct_class_by_name(**training_set_kwargs)
    log(f'Dataset: {len(training_set)} images, {training_set.resolution}x{training_set.resolution}, '
        f'{training_set.num_channels} channel(s), labels: {training_set.label_dim or "none"}')

    # Construct networks, optimizers, loss and schedule.
    G = dnnlib.util.construct_class_by_name(**G_kwargs).train().requires_grad_(False).to(device)
    D = dnnlib.util.construct_class_by_name(**D_kwargs).train().requires_grad_(False).to(device)
    G_ema = copy.deepcopy(G).eval()
    G_opt = dnnlib.util.construct_class_by_name(params=G.parameters(), **G_opt_kwargs)
    D_opt = dnnlib.util.construct_class_by_name(params=D.parameters(), **D_opt_kwargs)
    loss = dnnlib.util.construct_class_by_name(**loss_kwargs, G=G, D=D)
    scalers = [torch.amp.GradScaler(device.type, enabled=loss.precision == 'fp16') for _ in 'DG']  # fp16 loss scaling.
    schedule = dnnlib.util.construct_class_by_name(**schedule_kwargs)
    log(f'G: {sum(p.numel() for p in G.parameters()):,} parameters, D: {sum(p.numel() for p in D.parameters()):,}')

    # Resume: networks, optimizer states, progress and random states.
    step, cur_nimg, cur_tick, consumed = 0, 0, 0, 0
    best = None  # Lowest value of best_metric so far.
    if resume_pkl is not None:
        log(f'Resuming from "{resume_pkl}"')
        persistence.remove_stale_temporaries(os.path.dirname(os.path.abspath(resume_pkl)))  # Left by a killed writer.
        snapshot = persistence.load_snapshot(resume_pkl)
        for name, module in [('G', G), ('D', D), ('G_ema', G_ema)]:
            misc.copy_params_and_buffers(snapshot[name], module, require_all=True)
        G_opt.load_state_dict(snapshot.G_opt_state)
        D_opt.load_state_dict(snapshot.D_opt_state)
        progress = snapshot.progress
        step, cur_nimg, cur_tick, consumed = progress.step, progress.cur_nimg, progress.cur_tick, progress.consumed
        best = progress.best if progress.best_metric == best_metric else None
        if len(snapshot.rng_states) == num_gpus:
            torch.set_rng_state(snapshot.rng_states[rank].torch)
            if device.type == 'cuda' and snapshot.rng_states[rank].cuda is not None:
                torch.cuda.set_rng_state(snapshot.rng_states[rank].cuda)
            label_rng.bit_generator.state = snapshot.rng_states[rank].labels
        else:
            log(f'Warning: the snapshot was written by {len(snapshot.rng_states)} processes, this run has {num_gpus}; '
                f'random streams restart from the seed')
        del snapshot
    for module in (G, D, G_ema):
        misc.broadcast_module(module)

    # Data stream: chunks small enough for every batch size the run will use.
    reals = RealImageStream(training_set, chunk=schedule.min_share(), rank=rank, num_replicas=num_gpus,
                            seed=random_seed, device=device, num_workers=num_workers, consumed=consumed)

    # Outputs: statistics, TensorBoard, image grids.
    stats_collector = training_stats.Collector(regex='.*')
    stats_jsonl = tb_writer = None
    if rank == 0:
        stats_jsonl = open(os.path.join(run_dir, 'stats.jsonl'), 'at')
        try:
            import torch.utils.tensorboard as tensorboard
            tb_writer = tensorboard.SummaryWriter(run_dir)
        except ImportError:
            pass
        if image_snapshot_ticks is not None:
            grid_rng = np.random.default_rng(random_seed)
            grid_size, grid_labels = grid_layout(training_set, max_images=64)
            grid_z = torch.from_numpy(grid_rng.standard_normal([grid_labels.shape[0], G.z_dim])).float().to(device)
            grid_c = torch.from_numpy(grid_labels).to(device)
            real_grid = grid_reals(training_set, grid_labels, grid_rng)
            misc.save_image_grid(real_grid / 127.5 - 1, os.path.join(run_dir, 'reals.png'), grid_size)

    def save_grid(label: str) -> str:
        with torch.no_grad():
            fakes = torch.cat([G_ema(z, c) for z, c in zip(grid_z.split(16), grid_c.split(16))])
        path = os.path.join(run_dir, f'fakes{label}.png')
        misc.save_image_grid(fakes, path, grid_size)
        return path

    def snapshot_data() -> dict:
        """Everything a resumed run needs, from this process's point of view (rank 0 writes it)."""
        rng_state = dict(torch=torch.get_rng_state(), labels=label_rng.bit_generator.state,
                         cuda=torch.cuda.get_rng_state(device) if device.type == 'cuda' else None)
        rng_states = [rng_state] * num_gpus
        if num_gpus > 1:
            torch.distributed.all_gather_object(rng_states, rng_state)
        return dict(G=G, D=D, G_ema=G_ema, training_set_kwargs=dnnlib.util.to_plain(training_set_kwargs),
                    G_opt_state=G_opt.state_dict(), D_opt_state=D_opt.state_dict(), rng_states=rng_states,
                    progress=dict(step=step, cur_nimg=cur_nimg, cur_tick=cur_tick, consumed=reals.consumed,
                                  best_metric=best_metric, best=best))

    def evaluate_metrics(snapshot_pkl: str) -> dict:
        """Every metric on G_ema (all processes together), as {'Metrics/<name>': {num, mean, std}} for stats.jsonl."""
        nonlocal metrics, best
        from metrics import metric_main, metric_utils
        entries = {}
        for metric in metrics:
            try:
                result = metric_main.calc_metric(metric=metric, G=G_ema, dataset_kwargs=training_set_kwargs,
                                                 num_gpus=num_gpus, rank=rank, device=device, progress=log,
                                                 **metric_kwargs)
            except metric_utils.DetectorUnavailableError as e:
                log(f'Warning: {e}; training continues without metrics')
                metrics = []
                return {}
            if rank == 0:
                metric_main.report_metric(result, run_dir=run_dir, snapshot_pkl=snapshot_pkl)
            for name, value in result.results.items():
                entries[f'Metrics/{name}'] = dnnlib.EasyDict(num=1, mean=value, std=0.0)
        return entries

    # Train.
    log(f'Training: {schedule.describe()[0]}')
    last_snapshot = last_grid = None
    if rank == 0 and image_snapshot_ticks is not None and resume_pkl is None:
        save_grid('_init')
    tick_start_nimg, tick_start_step, tick_start_time = cur_nimg, step, time.time()
    session_start_time, session_start_progress = tick_start_time, schedule.progress(step, cur_nimg)
    maintenance_time = tick_start_time - start_time
    phase = schedule.plan(step, cur_nimg).phase
    first_bad_step = torch.full([2], NEVER, dtype=torch.int64, device=device)  # Of D and of G.
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats()

    def update(net: int, module: torch.nn.Module, optimizer: torch.optim.Optimizer, rounds: int,
               batch: list[torch.Tensor | None]) -> None:
        """One optimizer step of D (net 0) or G (net 1) on this process's batch [real_img, real_c, gen_z, gen_c]
        (reals None for G), in `rounds` accumulation rounds; gradients and buffers (BatchNorm statistics,
        w_avg) averaged over processes."""
        scaler = scalers[net]
        optimizer.zero_grad(set_to_none=True)
        gain = scaler.scale(torch.ones([], device=device)) / rounds if scaler.is_enabled() else 1 / rounds  # fp16: loss scale.
        for r in range(rounds):
            round_batch = [x if x is None else split_round(x, r, rounds, schedule.group_size) for x in batch]
            loss.accumulate_gradients('DG'[net], *round_batch, gain=gain)
        params = [p for p in module.parameters() if p.grad is not None]
        misc.all_reduce_mean_grads(params)
        if not scaler.is_enabled():  # With fp16 an overflow only skips the step (GradScaler); the losses tell divergence.
            # Remember the first step with a NaN/Inf gradient, on the device: the host looks only at the next tick.
            first_bad_step[net] = torch.where(~torch.isfinite(grad_norm(params)) & (first_bad_step[net] == NEVER),
                                              step + 1, first_bad_step[net])  # Counted from 1, as in the progress lines.
        scaler.step(optimizer)
        scaler.update()
        misc.all_reduce_mean_buffers(module)

    while not schedule.done(step, cur_nimg):
        # Hyperparameters of this step; Adam state reset at every new phase (StyleGAN v1's new lods).
        plan = schedule.plan(step, cur_nimg)
        if plan.phase != phase:
            reset_optimizer_state(G_opt)
            reset_optimizer_state(D_opt)
            phase = plan.phase
        set_lr(G_opt, plan.lr_G)
        set_lr(D_opt, plan.lr_D)
        if plan.lod is not None:
            for net in (G, D, G_ema):
                net.set_lod(plan.lod)
        rounds_D, rounds_G = plan.rounds(num_gpus)
        batch_D, batch_G = plan.batch_D // num_gpus, plan.batch_G // num_gpus

        # Discriminator steps: reals (flipped at random) and fakes G(z, c).
        D.requires_grad_(True)
        for _ in range(plan.n_dis):
            real_img, real_c = reals.next(batch_D)
            if plan.lod is not None:
                real_img = progressive.process_reals(real_img, plan.lod, G.img_resolution)
            if xflip:
                real_img = random_xflip(real_img)
            gen_z = torch.randn(batch_D, G.z_dim, device=device)
            gen_c = sample_labels(training_set, batch_D, label_rng, device)
            update(0, D, D_opt, rounds_D, [real_img, real_c, gen_z, gen_c])
            cur_nimg += plan.batch_D
        D.requires_grad_(False)

        # Generator step, then its moving average.
        G.requires_grad_(True)
        gen_z = torch.randn(batch_G, G.z_dim, device=device)
        gen_c = sample_labels(training_set, batch_G, label_rng, device)
        update(1, G, G_opt, rounds_G, [None, None, gen_z, gen_c])
        G.requires_grad_(False)
        update_ema(G_ema, G, plan.ema_beta)
        step += 1

        # Tick?
        done = schedule.done(step, cur_nimg)
        if not done and cur_nimg < tick_start_nimg + kimg_per_tick * 1000:
            continue

        # Tick: stop on a non-finite gradient (or, with fp16, weight) before anything is written.
        if num_gpus > 1:
            torch.distributed.all_reduce(first_bad_step, op=torch.distributed.ReduceOp.MIN)
        bad_steps = first_bad_step.tolist()
        stats_collector.update()
        stats = stats_collector.as_dict()
        bad_losses = [name for name in stats_collector.nonfinite_names() if name.startswith(('Loss/D/', 'Loss/G/'))]
        bad_weights = [f'{name}.{t}' for name, net in (('D', D), ('G', G)) if (t := misc.find_nonfinite(net)) is not None]
        if min(bad_steps) != NEVER:
            net = 'DG'[int(np.argmin(bad_steps))]
            where = f'at G step {min(bad_steps)}: non-finite gradient of {net}'
        elif bad_weights:  # fp16: overflowing steps are skipped (their losses may be NaN); broken weights are not.
            net = bad_weights[0][0]
            where = f'between G steps {tick_start_step + 1} and {step}: non-finite weight {bad_weights[0]}'
        if min(bad_steps) != NEVER or bad_weights:
            terms = [name for name in bad_losses if name.startswith(f'Loss/{net}/')]
            raise TrainingDiverged(f'training diverged {where}{" (loss terms: " + ", ".join(terms) + ")" if terms else ""}; '
                                   f'the last snapshot written before it is the last finite one')

        # Tick: report progress.
        tick_end_time = time.time()
        sec_per_kimg = (tick_end_time - tick_start_time) / max((cur_nimg - tick_start_nimg) / 1000, 1e-8)
        done_share = schedule.progress(step, cur_nimg)
        eta = (tick_end_time - session_start_time) * (1 - done_share) / max(done_share - session_start_progress, 1e-12)
        for name, value in [('Progress/tick', cur_tick), ('Progress/step', step), ('Progress/kimg', cur_nimg / 1000),
                            ('Timing/sec_per_kimg', sec_per_kimg)] + ([('Progress/lod', plan.lod)] if plan.lod is not None else []):
            stats[name] = dnnlib.EasyDict(num=1, mean=float(value), std=0.0)
        fields = [f'tick {cur_tick:<4d}', f'step {step:<7d}', f'kimg {cur_nimg / 1000:<8.1f}',
                  f'done {100 * done_share:5.1f}%', f'ETA {dnnlib.util.format_time(eta) if not done else "-":<11s}']
        phase_label = schedule.phase_label(step, cur_nimg)
        if phase_label is not None:
            fields += [f'lod {plan.lod:<5.2f}', f'phase {phase_label:<18s}']
        fields += [f'time {dnnlib.util.format_time(tick_end_time - start_time):<12s}',
                   f'sec/kimg {sec_per_kimg:<7.2f}',
                   f'maintenance {maintenance_time:<5.1f}',
                   f'cpumem {psutil.Process(os.getpid()).memory_info().rss / 2**30:<5.2f}']
        if device.type == 'cuda':
            fields += [f'gpumem {torch.cuda.max_memory_allocated(device) / 2**30:<5.2f}']
            torch.cuda.reset_peak_memory_stats()
        for name, short in [('Loss/D/loss', 'loss_D'), ('Loss/G/loss', 'loss_G')]:
            if name in stats:
                fields += [f'{short} {stats[name].mean:<7.3f}']
        log(' '.join(fields))
        cur_tick += 1

        # Tick: image grid, snapshot, metrics (before the snapshot, so that it records its own result).
        maintenance_start = time.time()
        label = snapshot_label(cur_nimg)
        if rank == 0 and image_snapshot_ticks is not None and (done or cur_tick % image_snapshot_ticks == 0):
            last_grid = save_grid(label)
        if done or (network_snapshot_ticks is not None and cur_tick % network_snapshot_ticks == 0):
            for module in (G, D, G_ema):
                misc.check_ddp_consistency(module)  # Every process must hold the same networks.
            snapshot_pkl = os.path.join(run_dir, f'network-snapshot-{label}.pkl')
            if metrics:
                stats.update(evaluate_metrics(snapshot_pkl))
            new_best = best_metric is not None and f'Metrics/{best_metric}' in stats and \
                (best is None or stats[f'Metrics/{best_metric}'].mean < best)
            if new_best:
                best = stats[f'Metrics/{best_metric}'].mean
            data = snapshot_data()
            if rank == 0:
                persistence.save_snapshot(snapshot_pkl, data)
                last_snapshot = snapshot_pkl
                if new_best:
                    persistence.save_snapshot(os.path.join(run_dir, 'network-best.pkl'), data)
                    log(f'New best {best_metric}: {best:.4g} -> network-best.pkl')
        if rank == 0:
            stats_jsonl.write(json.dumps(dict(stats, timestamp=time.time())) + '\n')
            stats_jsonl.flush()
            if tb_writer is not None:
                for name, value in stats.items():
                    tb_writer.add_scalar(name, value.mean, global_step=int(cur_nimg / 1000))
                tb_writer.flush()
        tick_start_nimg, tick_start_step, tick_start_time = cur_nimg, step, time.time()
        maintenance_time = tick_start_time - maintenance_start

    # Done: say where the results are.
    if rank == 0:
        stats_jsonl.close()
        if tb_writer is not None:
            tb_writer.close()
        log('Exiting...')
        if last_snapshot is not None:
            log(f'Final snapshot: {last_snapshot}')
            pick_class = ' --class=0' if G.c_dim else ''  # Conditional: any class in 0..c_dim-1.
            log(f'Generate images: python generate.py --network={last_snapshot} --seeds=0-63 --grid{pick_class} --outdir=out')
        if last_grid is not None:
            log(f'Image grids: {os.path.join(run_dir, "fakes*.png")} (latest: {os.path.basename(last_grid)})')
