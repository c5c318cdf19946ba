"""Train a GAN whose discriminator is constrained by gradient normalization (GN).

Examples:

\b
  # Quick start: a small GN-GAN on the embedded 32x32 digits, a few minutes on a CPU.
  python train.py --outdir=training-runs

\b
  # The paper's CIFAR-10 ResNet with GN and hinge loss, FID and IS at every snapshot.
  python dataset_tool.py --source=cifar-10-python.tar.gz --dest=cifar10.zip
  python train.py --outdir=training-runs --cfg=cifar10-resnet --data=cifar10.zip --metrics=fid50k_full,is50k

\b
  # GN-StyleGAN on CelebA-HQ 1024x1024 with 8 GPUs, progressive growing from 8x8.
  python train.py --outdir=training-runs --cfg=gn-stylegan --data=celebahq-1024.zip --gpus=8
"""

from __future__ import annotations

import json
import os
import re
import socket

import click
import torch

import dnnlib
from torch_utils import persistence

QUICKSTART_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'digits32.zip')

#----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _run_process(rank: int, args: dnnlib.EasyDict, init_method: str | None) -> None:
    """Body of one training process: spawned by --gpus=N (init_method given) or a torchrun worker."""
    from training import training_loop
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get('LOCAL_RANK', rank)))
    if args.num_gpus > 1 and not torch.distributed.is_initialized():
        _init_process_group(init_method, rank=rank, world_size=args.num_gpus)
    logger = dnnlib.util.Logger(os.path.join(args.run_dir, 'log.txt')) if rank == 0 else None
    try:
        training_loop.training_loop(rank=rank, **args)
    finally:
        if logger is not None:
            logger.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _init_process_group(init_method: str, rank: int, world_size: int) -> None:
    backend = 'nccl' if torch.cuda.is_available() else 'gloo'
    torch.distributed.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)


def _next_run_dir(outdir: str, desc: str) -> str:
    prev = [int(m.group(1)) for d in (os.listdir(outdir) if os.path.isdir(outdir) else [])
            if (m := re.match(r'^(\d+)-', d)) and os.path.isdir(os.path.join(outdir, d))]
    return os.path.join(outdir, f'{max(prev, default=-1) + 1:05d}-{desc}')


def _open_dataset(data: str, use_labels: bool) -> tuple[dict, object]:
    """Open the training data and return its kwargs and the dataset (labels only for conditional presets)."""
    from training.dataset import ImageFolderDataset
    try:
        dataset = ImageFolderDataset(path=data, use_labels=use_labels)
    except (OSError, ValueError) as e:
        raise click.ClickException(f'--data: {e}')
    return dnnlib.EasyDict(dataset.init_kwargs), dataset

def _check_resume(resume: str, cfg: dnnlib.EasyDict, dataset: object) -> None:
    """Refuse, in one line, a snapshot that cannot continue this run (unreadable, or other networks)."""
    try:
        snapshot = persistence.load_snapshot(resume)
    except (OSError, persistence.UnsafeSnapshotError) as e:
        raise click.ClickException(f'--resume: {e}')
    img_resolution = dataset.resolution if cfg.get('progressive') is None else cfg.progressive.max_resolution
    common = dict(c_dim=dataset.label_dim, img_resolution=img_resolution, img_channels=dataset.num_channels)
    for name, kwargs in [('G', cfg.G_kwargs), ('D', cfg.D_kwargs)]:
        expected = dnnlib.EasyDict(kwargs, **common)
        class_name = expected.pop('class_name')
        net = snapshot.get(name)
        if net is None or persistence.class_name_of(type(net)) != class_name or dnnlib.util.to_plain(net.init_kwargs) != dnnlib.util.to_plain(expected):
            raise click.ClickException(f'--resume: the {name} of {resume} is not the network that --cfg={cfg.name} '
                                       f'builds for this data; resume with the same --cfg, --norm and --data')

#----------------------------------------------------------------------------


@click.command(help=__doc__)
@click.option('--outdir', help='Where to make the run directory', metavar='DIR', default='training-runs', show_default=True)
@click.option('--cfg', help='Preset (network, loss, optimizer, schedule); see docs/configs.md', default='quickstart', show_default=True)
@click.option('--data', help='Training data: zip or folder made by dataset_tool.py  [default: the embedded digits]', metavar='PATH')
@click.option('--gpus', help='Number of processes (one per GPU; gloo on a CPU)', type=click.IntRange(min=1), default=1, show_default=True)
@click.option('--batch', help='Override the discriminator batch size M (G keeps the preset\'s ratio, 2M for SN-GAN presets); gn-stylegan: cap on the schedule\'s minibatch', type=click.IntRange(min=1))
@click.option('--kimg', help='Override the run length in thousands of real images shown to D', type=click.FloatRange(min=0, min_open=True))
@click.option('--steps', help='Override the run length in generator steps (fixed-batch presets)', type=click.IntRange(min=1))
@click.option('--norm', help='Discriminator constraint  [default: gn]', type=click.Choice(['gn', 'gn1', 'gn0', 'sn', 'gp1', 'gp0', 'r1', 'none']))
@click.option('--loss', help='Adversarial loss  [default: the preset\'s]', type=click.Choice(['hinge', 'ns', 'ns-nosigmoid', 'wasserstein']))
@click.option('--cr', help='Consistency regularization weight (paper: 5)  [default: 0]', type=click.FloatRange(min=0))
@click.option('--resolution', help='gn-stylegan: final resolution of progressive growing (default: the data\'s)', type=int)
@click.option('--cmax', help='gn-stylegan: maximum feature maps per layer (512 in the paper)', type=click.IntRange(min=1))
@click.option('--lod-kimg', help='gn-stylegan: thousands of images per resolution phase and per fade-in', type=click.FloatRange(min=0, min_open=True), default=600, show_default=True)
@click.option('--seed', help='Random seed', type=click.IntRange(min=0), default=0, show_default=True)
@click.option('--tick', help='Progress line every this many kimg', type=click.FloatRange(min=0, min_open=True), default=4, show_default=True)
@click.option('--snap', help='Snapshot (networks, image grid, metrics) every this many ticks', type=click.IntRange(min=1), default=50, show_default=True)
@click.option('--metrics', help='Metrics at every snapshot, comma-separated, or "none" (e.g. fid50k_full,is50k)', default='none', show_default=True)
@click.option('--ref-data', help='Reference split for the fid50k / fid10k metrics (e.g. the CIFAR-10 test set)', metavar='PATH')
@click.option('--detector', help='Inception detector file or URL for the metrics (offline machines)', metavar='PATH_OR_URL')
@click.option('--resume', help='Continue from a network snapshot (optimizer state and progress included)', metavar='PKL')
@click.option('--workers', help='DataLoader worker processes per process  [default: 3 with CUDA, 0 on a CPU, where workers would compete with training for the cores]', type=click.IntRange(min=0))
@click.option('--dry-run', help='Print the options and exit', is_flag=True)
def main(**opts):
    opts = dnnlib.EasyDict(opts)
    from training import configs, progressive

    # Under torchrun this process is one worker of WORLD_SIZE; --gpus is then ignored.
    distributed_env = 'RANK' in os.environ and 'WORLD_SIZE' in os.environ
    rank = int(os.environ['RANK']) if distributed_env else 0
    if distributed_env:
        opts.gpus = int(os.environ['WORLD_SIZE'])

    # Preset and overrides.
    try:
        cfg = configs.get_config(opts.cfg, norm=opts.norm, loss=opts.loss, cr=opts.cr)
    except ValueError as e:
        raise click.ClickException(str(e))
    data = opts.data if opts.data is not None else QUICKSTART_DATA
    if not os.path.exists(data):
        raise click.ClickException(f'--data: no such file or folder: {data}')
    training_set_kwargs, dataset = _open_dataset(data, use_labels=bool(cfg.get('conditional')))
    if cfg.get('conditional') and not dataset.has_labels:
        raise click.ClickException(f'--cfg={opts.cfg} is class-conditional, but {data} has no labels')
    if cfg.get('progressive') is not None:
        try:
            configs.fit_progressive(cfg, dataset_resolution=dataset.resolution, max_resolution=opts.resolution,
                                    lod_kimg=opts.lod_kimg)
        except ValueError as e:
            raise click.ClickException(str(e))
        if opts.cmax is not None:
            cfg.G_kwargs.fmap_max = cfg.D_kwargs.fmap_max = opts.cmax
    elif opts.resolution is not None or opts.cmax is not None:
        raise click.ClickException('--resolution and --cmax apply to --cfg=gn-stylegan only')
    elif cfg.get('resolution') is not None and cfg.resolution != dataset.resolution:
        raise click.ClickException(f'--cfg={opts.cfg} is built for {cfg.resolution}x{cfg.resolution} images, '
                                   f'but {data} holds {dataset.resolution}x{dataset.resolution}')
    if opts.batch is not None and cfg.get('progressive') is not None:
        if opts.batch % opts.gpus != 0:
            raise click.ClickException(f'--batch={opts.batch} must be divisible by --gpus={opts.gpus}')
        cfg.progressive.batch_per_gpu = {res: min(n, opts.batch // opts.gpus) for res, n in progressive.BATCH_PER_GPU.items()}
    elif opts.batch is not None:
        cfg.batch_G = cfg.batch_G * opts.batch // cfg.batch_D
        cfg.batch_D = opts.batch
    if opts.steps is not None and opts.kimg is not None:
        raise click.ClickException('give --kimg or --steps, not both')
    if cfg.get('progressive') is None:
        if opts.kimg is not None:
            cfg.total_steps = max(1, round(opts.kimg * 1000 / (cfg.n_dis * cfg.batch_D)))
        if opts.steps is not None:
            cfg.total_steps = opts.steps
        for name in ('batch_D', 'batch_G'):
            if cfg[name] % opts.gpus != 0:
                raise click.ClickException(f'the batch size ({name}={cfg[name]}) must be divisible by --gpus={opts.gpus}')
    else:
        if opts.steps is not None:
            raise click.ClickException('--cfg=gn-stylegan counts its length in --kimg, not --steps')
        if opts.kimg is not None:
            cfg.total_kimg = opts.kimg
    metrics = [] if opts.metrics.strip().lower() == 'none' else [m.strip() for m in opts.metrics.split(',') if m.strip()]
    if metrics:
        from metrics import metric_main
        unknown = [m for m in metrics if not metric_main.is_valid_metric(m)]
        if unknown:
            raise click.ClickException(f'--metrics: unknown {", ".join(unknown)}; valid: {", ".join(metric_main.list_valid_metrics())}')
    ref_set_kwargs = None
    if opts.ref_data is not None:
        if not os.path.exists(opts.ref_data):
            raise click.ClickException(f'--ref-data: no such file or folder: {opts.ref_data}')
        ref_set_kwargs = dict(class_name='training.dataset.ImageFolderDataset', path=opts.ref_data)
    if any(m in ('fid50k', 'fid10k') for m in metrics) and ref_set_kwargs is None:
        raise click.ClickException('--metrics=fid50k/fid10k compare with a reference split: give it with --ref-data')
    if opts.resume is not None:
        _check_resume(opts.resume, cfg, dataset)

    if opts.workers is None:
        opts.workers = 3 if torch.cuda.is_available() else 0
    args = dnnlib.EasyDict(
        cfg=cfg, training_set_kwargs=training_set_kwargs, num_workers=opts.workers, random_seed=opts.seed,
        num_gpus=opts.gpus, kimg_per_tick=opts.tick, image_snapshot_ticks=opts.snap, network_snapshot_ticks=opts.snap,
        metrics=metrics, ref_set_kwargs=ref_set_kwargs, detector_url=opts.detector, resume_pkl=opts.resume)
    dataset_name = os.path.splitext(os.path.basename(os.path.normpath(data)))[0]
    desc = f'{dataset_name}-{cfg.name}-{cfg.loss_kwargs.norm}'
    if rank == 0:
        print()
        print('Training options:')
        print(json.dumps(dnnlib.util.to_plain(dict(args, run_desc=desc)), indent=2))
        print()
    if opts.dry_run:
        if rank == 0:
            print('Dry run; exiting.')
        return

    if distributed_env:  # Rank 0 names the run directory and tells the other workers.
        run_dir = [_next_run_dir(opts.outdir, desc) if rank == 0 else None]
        if args.num_gpus > 1:
            if torch.cuda.is_available():
                torch.cuda.set_device(int(os.environ.get('LOCAL_RANK', 0)))
            _init_process_group('env://', rank=rank, world_size=args.num_gpus)
            torch.distributed.broadcast_object_list(run_dir, src=0)
        args.run_dir = run_dir[0]
    else:
        args.run_dir = _next_run_dir(opts.outdir, desc)
    if rank == 0:
        print(f'Output directory: {args.run_dir}')
        os.makedirs(args.run_dir, exist_ok=False)
        with open(os.path.join(args.run_dir, 'training_options.json'), 'wt') as f:
            json.dump(dnnlib.util.to_plain(dict(args, run_desc=desc)), f, indent=2)

    if distributed_env:
        if torch.distributed.is_initialized():
            torch.distributed.barrier()  # The run directory exists before any worker writes to it.
        _run_process(rank, args, init_method=None)
    elif args.num_gpus == 1:
        _run_process(0, args, init_method=None)
    else:
        torch.multiprocessing.spawn(_run_process, args=(args, f'tcp://127.0.0.1:{_free_port()}'), nprocs=args.num_gpus)


if __name__ == '__main__':
    main()
