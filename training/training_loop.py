"""The training loop: the paper's alternating D/G updates, with logging, snapshots and metrics.

One outer iteration is one generator update ("G step", the unit the paper counts in):

    for each G step:
        repeat n_dis times:                       # discriminator updates
            x ~ data (batch M), z ~ N(0, I) (batch M)
            minimize L_D(f_hat(x), f_hat(G(z)))   # f_hat = GN-normalized D, see training/gradnorm.py
        z ~ N(0, I) (batch 2M)
        minimize L_G(f_hat(G(z)))
        G_ema <- beta * G_ema + (1 - beta) * G
        lr <- base_lr * (1 - step / total_steps)  # only for presets with linear decay

Progressive growing (gn-stylegan) replaces the fixed batch size, learning rate and resolution by
a schedule over the number of real images shown so far (training/progressive.py): each step sets
the level of detail `lod` on G, D and G_ema and feeds D reals brought to that resolution.

Several processes (one per GPU, or gloo on a CPU) each hold full copies of G and D, draw disjoint
shards of the data and average their gradients after every backward pass.
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
from training import progressive as schedule_lib

#----------------------------------------------------------------------------
# Data.


class InfiniteSampler(torch.utils.data.Sampler):
    """Endless shuffled stream of dataset indices; process `rank` gets every `num_replicas`-th one.

    Each pass over the data uses a new permutation, so processes see disjoint images within a
    pass and every image is visited once per pass over all processes.
    """

    def __init__(self, dataset_size: int, rank: int = 0, num_replicas: int = 1, seed: int = 0) -> None:
        if dataset_size <= 0:
            raise ValueError('The dataset is empty')
        self.dataset_size = dataset_size
        self.rank = rank
        self.num_replicas = num_replicas
        self.seed = seed

    def __iter__(self) -> Iterator[int]:
        rng = np.random.default_rng(self.seed)
        position = 0
        while True:
            for idx in rng.permutation(self.dataset_size):
                if position % self.num_replicas == self.rank:
                    yield int(idx)
                position += 1


class RealImageStream:
    """Batches of real images (float in [-1, 1], on the device) and their labels, of any size.

    The DataLoader delivers fixed chunks; a batch of another size (the progressive schedule
    changes it with the resolution) is assembled from as many chunks as it needs.
    """

    def __init__(self, dataset: Any, chunk: int, rank: int, num_replicas: int, seed: int, device: torch.device,
                 num_workers: int) -> None:
        sampler = InfiniteSampler(len(dataset), rank=rank, num_replicas=num_replicas, seed=seed)
        loader = torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=chunk, num_workers=num_workers,
                                             pin_memory=device.type == 'cuda',
                                             persistent_workers=num_workers > 0, prefetch_factor=2 if num_workers > 0 else None)
        self._iterator = iter(loader)
        self._device = device
        self._img: list[torch.Tensor] = []
        self._c: list[torch.Tensor] = []
        self._count = 0

    def next(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        while self._count < batch:
            img, c = next(self._iterator)
            self._img.append(img)
            self._c.append(c)
            self._count += img.shape[0]
        img, c = torch.cat(self._img), torch.cat(self._c)
        self._img, self._c, self._count = [img[batch:]], [c[batch:]], img.shape[0] - batch
        img = img[:batch].to(self._device, non_blocking=True).to(torch.float32) / 127.5 - 1
        return img, c[:batch].to(self._device, non_blocking=True)


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


#----------------------------------------------------------------------------
# Learning-rate schedules and EMA.


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group['lr'] = lr


@torch.no_grad()
def update_ema(G_ema: torch.nn.Module, G: torch.nn.Module, beta: float) -> None:
    """G_ema <- beta * G_ema + (1 - beta) * G for parameters; buffers (BN statistics, w_avg, lod) are copied."""
    for p_ema, p in zip(G_ema.parameters(), G.parameters()):
        p_ema.copy_(p.detach().lerp(p_ema, beta))
    for b_ema, b in zip(G_ema.buffers(), G.buffers()):
        b_ema.copy_(b)

#----------------------------------------------------------------------------


def training_loop(
    run_dir: str = '.',                      # Output directory.
    cfg: dict = {},                          # Preset from training/configs.py (networks, loss, optimizers, batch, schedule).
    training_set_kwargs: dict = {},          # Dataset: class_name + kwargs.
    num_workers: int = 2,                    # DataLoader worker processes per rank.
    random_seed: int = 0,                    # Global seed.
    num_gpus: int = 1,                       # Number of processes.
    rank: int = 0,                           # This process.
    kimg_per_tick: float = 4,                # Progress is printed every this many thousand real images.
    image_snapshot_ticks: int | None = 50,   # Image grids every this many ticks (None = never).
    network_snapshot_ticks: int | None = 50, # Snapshots (and metrics) every this many ticks; always one at the end.
    metrics: list[str] = [],                 # Metrics evaluated at every snapshot.
    ref_set_kwargs: dict | None = None,      # Reference split of the fid50k / fid10k metrics.
    detector_url: str | None = None,         # Feature detector for the metrics (None = the default Inception).
    resume_pkl: str | None = None,           # Snapshot to continue from.
) -> None:
    """Train the networks of `cfg` on `training_set_kwargs` and write everything into `run_dir`."""
    start_time = time.time()
    device = torch.device('cuda', torch.cuda.current_device()) if torch.cuda.is_available() else torch.device('cpu')
    if device.type == 'cuda':
        torch.backends.cudnn.benchmark = True
        # Full fp32 matmuls/convolutions: TF32 would perturb the input gradients that GN divides by.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    misc.set_seed(random_seed * num_gpus + rank)
    label_rng = np.random.default_rng(random_seed * num_gpus + rank)
    cfg = dnnlib.EasyDict(copy.deepcopy(cfg))
    progressive = cfg.get('progressive')
    log = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)

    # Dataset.
    training_set = dnnlib.util.construct_class_by_name(**training_set_kwargs)
    log(f'Dataset: {len(training_set)} images, {training_set.resolution}x{training_set.resolution}, '
        f'{training_set.num_channels} channel(s), labels: {training_set.label_dim or "none"}')
    if cfg.get('conditional') and not training_set.has_labels:
        raise ValueError(f'--cfg={cfg.name} is class-conditional, but the dataset has no labels')

    # Networks.
    img_resolution = training_set.resolution if progressive is None else progressive.max_resolution
    common = dict(c_dim=training_set.label_dim, img_resolution=img_resolution, img_channels=training_set.num_channels)
    G = dnnlib.util.construct_class_by_name(**cfg.G_kwargs, **common).train().requires_grad_(False).to(device)
    D = dnnlib.util.construct_class_by_name(**cfg.D_kwargs, **common).train().requires_grad_(False).to(device)
    G_ema = copy.deepcopy(G).eval()
    G_opt = dnnlib.util.construct_class_by_name(params=G.parameters(), **cfg.G_opt_kwargs)
    D_opt = dnnlib.util.construct_class_by_name(params=D.parameters(), **cfg.D_opt_kwargs)
    loss = dnnlib.util.construct_class_by_name(**cfg.loss_kwargs, G=G, D=D)
    log(f'G: {sum(p.numel() for p in G.parameters()):,} parameters, D: {sum(p.numel() for p in D.parameters()):,}')

    # Progress counters; resume.
    step, cur_nimg, cur_tick = 0, 0, 0
    best_fid = float('inf')
    if resume_pkl is not None:
        log(f'Resuming from "{resume_pkl}"')
        snapshot = persistence.load_snapshot(resume_pkl)
        for name, module in [('G', G), ('D', D), ('G_ema', G_ema)]:
            misc.copy_params_and_buffers(snapshot[name], module, require_all=True)
        G_opt.load_state_dict(snapshot.G_opt_state)
        D_opt.load_state_dict(snapshot.D_opt_state)
        step, cur_nimg, cur_tick = snapshot.progress.step, snapshot.progress.cur_nimg, snapshot.progress.cur_tick
        best_fid = snapshot.progress.get('best_fid', best_fid)
        del snapshot
    misc.broadcast_module(G)
    misc.broadcast_module(D)
    misc.broadcast_module(G_ema)

    # Run length in G steps (fixed-batch presets) or in real images (progressive schedule).
    if progressive is None:
        total_steps = int(cfg.total_steps)
        for name, value in [('batch_D', cfg.batch_D), ('batch_G', cfg.batch_G)]:
            if value % num_gpus != 0:
                raise ValueError(f'{name}={value} is not divisible by --gpus={num_gpus}')
        done = lambda: step >= total_steps
    else:
        total_nimg = int(cfg.total_kimg * 1000)
        done = lambda: cur_nimg >= total_nimg

    # Data stream: chunks small enough for every batch size the run will use.
    chunk = cfg.batch_D // num_gpus if progressive is None else schedule_lib.min_batch(progressive, num_gpus)
    reals = RealImageStream(training_set, chunk=chunk, rank=rank, num_replicas=num_gpus,
                            seed=random_seed + step, device=device, num_workers=num_workers)

    # Outputs.
    stats_collector = training_stats.Collector(regex='.*')
    stats_jsonl = tb_writer = None
    grid_size, grid_z, grid_c = None, None, None
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
            real_grid = np.stack([training_set[int(i)][0] for i in grid_rng.integers(len(training_set), size=len(grid_labels))])
            misc.save_image_grid(real_grid / 127.5 - 1, os.path.join(run_dir, 'reals.png'), grid_size)

    def generate_grid(kimg_label: str) -> None:
        with torch.no_grad():
            fakes = torch.cat([G_ema(z, c) for z, c in zip(grid_z.split(16), grid_c.split(16))])
        misc.save_image_grid(fakes, os.path.join(run_dir, f'fakes{kimg_label}.png'), grid_size)

    def save_snapshot() -> str | None:
        """Write network-snapshot-<kimg>.pkl (rank 0 only) and return its path."""
        for module in (G, D, G_ema):
            misc.check_ddp_consistency(module)  # Every process must hold the same networks.
        if rank != 0:
            return None
        path = os.path.join(run_dir, f'network-snapshot-{cur_nimg // 1000:06d}.pkl')
        persistence.save_snapshot(path, snapshot_data())
        return path

    def snapshot_data() -> dict:
        return dict(G=G, D=D, G_ema=G_ema, training_set_kwargs=dnnlib.util.to_plain(training_set_kwargs),
                    G_opt_state=G_opt.state_dict(), D_opt_state=D_opt.state_dict(),
                    progress=dict(step=step, cur_nimg=cur_nimg, cur_tick=cur_tick, best_fid=best_fid),
                    cfg=dnnlib.util.to_plain(cfg))

    def update(phase: str, module: torch.nn.Module, optimizer: torch.optim.Optimizer, *batch: torch.Tensor) -> None:
        """One update of D or G: loss and backward, gradients averaged over processes, optimizer step,
        and buffers (BatchNorm statistics, w_avg) averaged so every process keeps the same network."""
        optimizer.zero_grad(set_to_none=True)
        loss.accumulate_gradients(phase, *batch)
        misc.all_reduce_mean_grads(module.parameters())
        optimizer.step()
        misc.all_reduce_mean_buffers(module)

    def evaluate_metrics(snapshot_pkl: str | None) -> dict:
        """Evaluate every metric on G_ema (all processes together); keep the best-FID snapshot.

        Returns the results as {'Metrics/<name>': {num, mean, std}} entries for stats.jsonl."""
        nonlocal metrics, best_fid
        from metrics import metric_main, metric_utils
        entries = {}
        for metric in metrics:
            try:
                result = metric_main.calc_metric(metric=metric, G=G_ema, dataset_kwargs=training_set_kwargs,
                                                 ref_dataset_kwargs=ref_set_kwargs, num_gpus=num_gpus, rank=rank,
                                                 device=device, detector_url=detector_url)
            except metric_utils.DetectorUnavailableError as e:
                log(f'Warning: {e}; training continues without metrics')
                metrics = []
                return entries
            if rank == 0:
                metric_main.report_metric(result, run_dir=run_dir, snapshot_pkl=snapshot_pkl)
                for name, value in result.results.items():
                    entries[f'Metrics/{name}'] = dnnlib.EasyDict(num=1, mean=value, std=0.0)
                fid = next((v for k, v in result.results.items() if k.startswith('fid')), None)
                if fid is not None and fid < best_fid:
                    best_fid = fid
                    persistence.save_snapshot(os.path.join(run_dir, 'network-best.pkl'), snapshot_data())
                    log(f'New best {metric}: {fid:.3f} -> network-best.pkl')
        return entries

    if rank == 0 and image_snapshot_ticks is not None and resume_pkl is None:
        generate_grid('_init')

    # Main loop.
    log(f'Training for {f"{total_steps} G steps" if progressive is None else f"{cfg.total_kimg} kimg"}...')
    tick_start_nimg, tick_start_time = cur_nimg, time.time()
    maintenance_time = tick_start_time - start_time
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats()
    while not done():
        # Hyperparameters of this step.
        if progressive is None:
            batch_D, batch_G = cfg.batch_D // num_gpus, cfg.batch_G // num_gpus
            lr_scale = 1 - step / total_steps if cfg.lr_decay == 'linear' else 1.0
            set_lr(G_opt, cfg.G_opt_kwargs.lr * lr_scale)
            set_lr(D_opt, cfg.D_opt_kwargs.lr * lr_scale)
            ema_beta = cfg.ema_beta if cfg.get('ema_beta') is not None and step >= cfg.get('ema_start', 0) else 0.0
            lod = None
        else:
            sched = schedule_lib.schedule(cur_nimg, num_gpus=num_gpus, **progressive)
            batch_D = batch_G = sched.batch // num_gpus
            set_lr(G_opt, sched.lr)
            set_lr(D_opt, sched.lr)
            ema_beta = sched.ema_beta
            lod = sched.lod
            for net in (G, D, G_ema):
                net.set_lod(lod)

        # Discriminator updates.
        D.requires_grad_(True)
        for _ in range(cfg.n_dis):
            real_img, real_c = reals.next(batch_D)
            if progressive is not None:
                real_img = schedule_lib.process_reals(real_img, lod, progressive.max_resolution)
            real_img = random_xflip(real_img)
            gen_z = torch.randn(batch_D, G.z_dim, device=device)
            gen_c = sample_labels(training_set, batch_D, label_rng, device)
            update('D', D, D_opt, real_img, real_c, gen_z, gen_c)
            cur_nimg += batch_D * num_gpus
        D.requires_grad_(False)

        # Generator update.
        G.requires_grad_(True)
        gen_z = torch.randn(batch_G, G.z_dim, device=device)
        gen_c = sample_labels(training_set, batch_G, label_rng, device)
        update('G', G, G_opt, real_img, real_c, gen_z, gen_c)
        G.requires_grad_(False)
        update_ema(G_ema, G, ema_beta)
        step += 1

        # Tick?
        if not done() and cur_nimg < tick_start_nimg + kimg_per_tick * 1000:
            continue

        # Tick: report progress.
        tick_end_time = time.time()
        sec_per_kimg = (tick_end_time - tick_start_time) / max((cur_nimg - tick_start_nimg) / 1000, 1e-8)
        training_stats.report('Progress/tick', cur_tick)
        training_stats.report('Progress/step', step)
        training_stats.report('Progress/kimg', cur_nimg / 1000)
        training_stats.report('Timing/sec_per_kimg', sec_per_kimg)
        if lod is not None:
            training_stats.report('Progress/lod', lod)
        fields = [f'tick {cur_tick:<4d}', f'step {step:<7d}', f'kimg {cur_nimg / 1000:<8.1f}']
        if lod is not None:
            fields += [f'lod {lod:<5.2f}']
        fields += [f'time {dnnlib.util.format_time(tick_end_time - start_time):<12s}',
                   f'sec/kimg {sec_per_kimg:<7.2f}',
                   f'maintenance {maintenance_time:<5.1f}',
                   f'cpumem {psutil.Process(os.getpid()).memory_info().rss / 2**30:<5.2f}']
        if device.type == 'cuda':
            fields += [f'gpumem {torch.cuda.max_memory_allocated(device) / 2**30:<5.2f}']
            torch.cuda.reset_peak_memory_stats()
        stats_collector.update()
        stats = stats_collector.as_dict()
        for name, short in [('Loss/D/loss', 'loss_D'), ('Loss/G/loss', 'loss_G')]:
            if name in stats:
                fields += [f'{short} {stats[name].mean:<7.3f}']
        log(' '.join(fields))
        cur_tick += 1

        maintenance_start = time.time()
        final = done()
        if rank == 0 and image_snapshot_ticks is not None and (final or cur_tick % image_snapshot_ticks == 0):
            generate_grid(f'{cur_nimg // 1000:06d}')
        if final or (network_snapshot_ticks is not None and cur_tick % network_snapshot_ticks == 0):
            snapshot_pkl = save_snapshot()
            if metrics:
                stats.update(evaluate_metrics(snapshot_pkl))
        if rank == 0:
            timestamp = time.time()
            stats_jsonl.write(json.dumps(dict(stats, timestamp=timestamp)) + '\n')
            stats_jsonl.flush()
            if tb_writer is not None:
                for name, value in stats.items():
                    tb_writer.add_scalar(name, value.mean, global_step=int(cur_nimg / 1000))
                tb_writer.flush()
        tick_start_nimg, tick_start_time = cur_nimg, time.time()
        maintenance_time = tick_start_time - maintenance_start

    if rank == 0:
        stats_jsonl.close()
        if tb_writer is not None:
            tb_writer.close()
    log('Exiting...')
