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

import ctypes
import json
import os
import re
import signal
import socket
import sys

from torch_utils.threads import set_threads, set_wait_policy

set_wait_policy()  # Before torch is imported (torch_utils/threads.py).

import click  # noqa: E402
import torch  # noqa: E402

import dnnlib  # noqa: E402
from torch_utils import devices, persistence  # noqa: E402
from training.loss import LOSSES, NORMS  # noqa: E402
from training.precision import PRECISIONS  # noqa: E402

QUICKSTART_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'digits32.zip')

#----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _end_with_parent() -> None:
    """Have Linux send this spawned process SIGTERM when train.py's own process ends, however it ends (a
    `kill`, the out-of-memory killer). torch's spawn asks for SIGINT instead, which a process started in the
    background by a script (`nohup python train.py ... &`) ignores: its workers trained on by themselves."""
    if not sys.platform.startswith('linux'):
        return
    PR_SET_PDEATHSIG = 1  # <sys/prctl.h>
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    parent = torch.multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # Ended before the request was made.
        sys.exit(1)


def _run_process(rank: int, args: dnnlib.EasyDict, init_method: str | None, num_threads: int | None) -> None:
    """Body of one training process: spawned by --gpus=N (init_method given) or a torchrun worker, on its share of
    args.device (torch_utils/devices.py), with `num_threads` CPU threads (None: the cores shared out between the
    processes on a CPU, torch's default on a GPU).

    A run that diverges, meets a bad image or cannot write its results ends with one line on stderr
    and a non-zero exit; its run directory keeps the log and the last finite snapshot.
    """
    from training import training_loop
    from training.dataset import DatasetError
    from training.reporter import TrainingDiverged
    if init_method is not None:  # Spawned by --gpus=N.
        _end_with_parent()
    device = devices.process_device(torch.device(args.device), _local_rank(rank))
    if device.type == 'cpu' and num_threads is None and args.num_gpus > 1:
        num_threads = max(1, (os.cpu_count() or 1) // args.num_gpus)
    set_threads(num_threads)
    if args.num_gpus > 1 and not torch.distributed.is_initialized():
        _init_process_group(init_method, rank=rank, world_size=args.num_gpus, device=device)
    logger = dnnlib.util.Logger(os.path.join(args.run_dir, 'log.txt')) if rank == 0 else None
    try:
        training_loop.training_loop(rank=rank, **dict(args, device=str(device)))
        if torch.distributed.is_initialized():
            torch.distributed.barrier()  # Leave together: tearing gloo down while another process still writes can abort it.
    except (TrainingDiverged, DatasetError, OSError) as e:
        print(f'Error: {e}', file=sys.stderr, flush=True)
        sys.exit(1)
    finally:
        if logger is not None:
            logger.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _local_rank(rank: int) -> int:
    """This process's index among the processes of its machine (torchrun says; --gpus=N spawns them all here)."""
    return int(os.environ.get('LOCAL_RANK', rank))


def _init_process_group(init_method: str, rank: int, world_size: int, device: torch.device) -> None:
    torch.distributed.init_process_group(devices.process_group_backend(device), init_method=init_method, rank=rank,
                                         world_size=world_size)


def _next_run_dir(outdir: str, desc: str) -> str:
    prev = [int(m.group(1)) for d in (os.listdir(outdir) if os.path.isdir(outdir) else [])
            if (m := re.match(r'^(\d+)-', d)) and os.path.isdir(os.path.join(outdir, d))]
    return os.path.join(outdir, f'{max(prev, default=-1) + 1:05d}-{desc}')


def _open_dataset(data: str, use_labels: bool, option: str = '--data') -> tuple[dict, object]:
    """Open the training data (or the reference data of `option`) and return its kwargs and the dataset (labels
    only for conditional presets)."""
    from training.dataset import ImageFolderDataset
    if not os.path.exists(data):
        raise click.ClickException(f'{option}: no such file or folder: {data}')
    try:
        dataset = ImageFolderDataset(path=os.path.abspath(data), use_labels=use_labels)  # Snapshots work from any folder.
        dataset.validate()  # Every image's header (size, channels, bit depth), before a run directory exists.
    except (OSError, ValueError) as e:
        raise click.ClickException(f'{option}: {e}')
    return dnnlib.EasyDict(dataset.init_kwargs), dataset


EXPERIMENT_DEFAULTS = dict(cfg='quickstart', norm=None, loss=None, cr=None, precision='tf32', seed=0, data=QUICKSTART_DATA,
                           xflip=None)  # None: the preset's.


def _load_resume(resume: str) -> dnnlib.EasyDict:
    """The snapshot to continue from, loaded once for the whole run; refused in one line if it is unreadable or
    has no optimizer state and progress (not written by train.py)."""
    from training.run_state import REQUIRED_KEYS
    persistence.remove_stale_temporaries(os.path.dirname(os.path.abspath(resume)))  # Left by a killed writer.
    try:
        snapshot = persistence.load_snapshot(resume)
    except (OSError, persistence.UnsafeSnapshotError) as e:
        raise click.ClickException(f'--resume: {e}')
    missing = [key for key in REQUIRED_KEYS if key not in snapshot]
    if missing:
        raise click.ClickException(f'--resume: {resume} lacks {", ".join(missing)}; only snapshots written by '
                                   f'train.py (network-snapshot-*.pkl) can be resumed')
    return snapshot


def _experiment_options(opts: dnnlib.EasyDict, snapshot: dnnlib.EasyDict | None) -> list[str]:
    """Fill the options that define the experiment (EXPERIMENT_DEFAULTS) in `opts`: the command line's, else the
    resumed snapshot's, else the defaults. A resumed run refuses, in one line, options given that differ from its
    snapshot's, unless --resume-override; returns those changed on purpose ('--norm=gp1 (was gn)')."""
    recorded = dict(snapshot.get('experiment') or {}) if snapshot is not None else {}
    if snapshot is not None and snapshot.get('training_set_kwargs'):
        recorded['data'] = snapshot.training_set_kwargs.get('path')
    changed = []
    for name, default in EXPERIMENT_DEFAULTS.items():
        given, was = opts[name], recorded.get(name)
        if name == 'data' and given is not None:
            given = os.path.abspath(given)
        if given is not None and was is not None and given != was:
            changed.append(f'--{name}={given} (was {was})')
        opts[name] = given if given is not None else (was if was is not None else default)
    if changed and not opts.resume_override:
        raise click.ClickException(f'--resume: {opts.resume} was trained with other options: {"; ".join(changed)}; leave '
                                   f'them out to take the snapshot\'s, or add --resume-override to change them on purpose')
    return changed


def _check_resume_networks(snapshot: dnnlib.EasyDict, args: dnnlib.EasyDict, opts: dnnlib.EasyDict) -> None:
    """Refuse, in one line, a snapshot whose networks are not the ones this run builds."""
    for name, kwargs in [('G', args.G_kwargs), ('D', args.D_kwargs)]:
        expected = dnnlib.EasyDict(kwargs)
        class_name = expected.pop('class_name')
        net = snapshot[name]
        if persistence.class_name_of(type(net)) != class_name or dnnlib.util.to_plain(net.init_kwargs) != dnnlib.util.to_plain(expected):
            raise click.ClickException(f'--resume: the {name} of {opts.resume} is not the network that --cfg={opts.cfg} '
                                       f'builds for this data; resume with the same --cfg, --norm, --cmax, --tanh and --data')


def _check_outdir(outdir: str) -> None:
    """Refuse an --outdir that is a file, or a folder (or the nearest existing parent) that cannot be written."""
    if os.path.exists(outdir) and not os.path.isdir(outdir):
        raise click.ClickException(f'--outdir: {outdir} is a file, not a folder')
    existing = os.path.abspath(outdir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise click.ClickException(f'--outdir: cannot write to {existing}')


def _parse_metrics(metrics: str) -> list[str]:
    from metrics import metric_main
    names = [] if metrics.strip().lower() == 'none' else [m.strip() for m in metrics.split(',') if m.strip()]
    if names:
        unknown = [m for m in names if not metric_main.is_valid_metric(m)]
        if unknown:
            raise click.ClickException(f'--metrics: unknown {", ".join(unknown)}; valid: {", ".join(metric_main.list_valid_metrics())}')
    return names

#----------------------------------------------------------------------------


@click.command(help=__doc__)
@click.option('--outdir', help='Where to make the run directory', metavar='DIR', default='training-runs', show_default=True, callback=dnnlib.util.expand_user)
@click.option('--cfg', help='Preset (network, loss, optimizer, schedule); see docs/configs.md  [default: quickstart; with --resume: the snapshot\'s]')
@click.option('--data', help='Training data: zip or folder made by dataset_tool.py  [default: the embedded digits; with --resume: the snapshot\'s]', metavar='PATH', callback=dnnlib.util.expand_user)
@click.option('--gpus', help='Number of processes (one per GPU; gloo on a CPU)', type=click.IntRange(min=1), default=1, show_default=True)
@click.option('--device', help='cpu, cuda or cuda:N  [default: cuda if torch sees a GPU, else cpu]; with --gpus=N, cuda (CUDA_VISIBLE_DEVICES picks the GPUs) or cpu', metavar='DEVICE')
@click.option('--deterministic', help='Repeatable GPU arithmetic: deterministic algorithms, no cuDNN benchmarking (a resumed GPU run then continues bit for bit; slower, docs/benchmarks.md)', is_flag=True)
@click.option('--batch', help='Override the global discriminator batch M, all GPUs together (G keeps the preset\'s ratio, 2M for SN-GAN presets); gn-stylegan: cap on the schedule\'s global minibatch', type=click.IntRange(min=1))
@click.option('--batch-gpu', help='Most samples one GPU processes at once; the rest of its share is gradient accumulation  [default: its whole share]', type=click.IntRange(min=1))
@click.option('--kimg', help='Override the run length in thousands of real images shown to D', type=click.FloatRange(min=0, min_open=True))
@click.option('--steps', help='Override the run length in generator steps (fixed-batch presets)', type=click.IntRange(min=1))
@click.option('--norm', help='Discriminator constraint  [default: gn; with --resume: the snapshot\'s]', type=click.Choice(NORMS))
@click.option('--loss', help='Adversarial loss  [default: the preset\'s; with --resume: the snapshot\'s]', type=click.Choice(LOSSES))
@click.option('--cr', help='Consistency regularization weight (paper: 5)  [default: 0; with --resume: the snapshot\'s]', type=click.FloatRange(min=0))
@click.option('--precision', help='Arithmetic of the networks: tf32 (float32 with TF32 tensor-core matmuls on CUDA; the same as fp32 on a CPU), fp32 (strict, the paper\'s), bf16 or fp16 (autocast; GN\'s norm and the losses stay float32); evidence in docs/precision.md  [default: tf32; with --resume: the snapshot\'s]', type=click.Choice(PRECISIONS))
@click.option('--resolution', help='gn-stylegan: final resolution of progressive growing (default: the data\'s)', type=int)
@click.option('--cmax', help='gn-stylegan: maximum feature maps per layer (512 in the paper)', type=click.IntRange(min=1))
@click.option('--lod-kimg', help='gn-stylegan: thousands of images per resolution phase and per fade-in  [default: 600]', type=click.FloatRange(min=0, min_open=True))
@click.option('--tanh', help='gn-stylegan: pass the generator\'s images through tanh, bounding them to (-1, 1) as the data is (StyleGAN v1\'s output is linear; small runs on flat-background data such as the digits need it, docs/results.md)', type=bool, default=False, show_default=True)
@click.option('--lr-rampdown', help='gn-stylegan: thousands of images at the end of the run over which the learning rates fall linearly to 0 (StyleGAN v1\'s stay constant)  [default: 0, none]', type=click.FloatRange(min=0))
@click.option('--xflip', help='Mirror the real images left-right at random  [default: the preset\'s: on for the paper\'s presets, off for quickstart; with --resume: the snapshot\'s]', type=bool)
@click.option('--seed', help='Random seed (initial weights, data order, latents, grids)  [default: 0; with --resume: the snapshot\'s]', type=click.IntRange(min=0))
@click.option('--tick', help='Progress line every this many kimg', type=click.FloatRange(min=0, min_open=True), default=4, show_default=True)
@click.option('--snap', help='Snapshot (networks, image grid, metrics) every this many ticks', type=click.IntRange(min=1), default=50, show_default=True)
@click.option('--metrics', help='Metrics at every snapshot, comma-separated, or "none" (e.g. fid50k_full,is50k)', default='none', show_default=True)
@click.option('--ref-data', help='Reference split for the fid50k / fid10k metrics (e.g. the CIFAR-10 test set)', metavar='PATH', callback=dnnlib.util.expand_user)
@click.option('--ref-stats', help='FID reference statistics (.npz of mu and sigma, e.g. the authors\' cifar10.train.npz) replacing the real images of every FID metric', metavar='NPZ', callback=dnnlib.util.expand_user)
@click.option('--best-metric', help='FID metric that decides network-best.pkl  [default: the first FID in --metrics]', metavar='NAME')
@click.option('--detector', help='Inception-v3 detector (TorchScript) of FID, IS and KID: path or URL (offline machines)', metavar='PATH_OR_URL', callback=dnnlib.util.expand_user)
@click.option('--pr-detector', help='VGG16 detector (TorchScript) of precision/recall: path or URL (offline machines)', metavar='PATH_OR_URL', callback=dnnlib.util.expand_user)
@click.option('--resume', help='Continue from a network snapshot (optimizer state, progress and random streams included) in a new run directory; --cfg, --norm, --loss, --cr, --precision, --seed, --data and --xflip default to the snapshot\'s', metavar='PKL', callback=dnnlib.util.expand_user)
@click.option('--resume-override', help='With --resume: accept --cfg, --norm, --loss, --cr, --precision, --seed, --data or --xflip differing from the snapshot\'s (recorded in training_options.json)', is_flag=True)
@click.option('--threads', help='CPU threads per process  [default: one per core, shared out between the --gpus processes on a CPU]; idle threads sleep at once (OMP_WAIT_POLICY=PASSIVE unless set), so a busy machine slows a run about in proportion', type=click.IntRange(min=1))
@click.option('--workers', help='DataLoader worker processes per process  [default: 3 with CUDA, 0 on a CPU, where workers would compete with training for the cores]', type=click.IntRange(min=0))
@click.option('--dry-run', help='Print the options and the schedule (phases, batches, accumulation, lr) and exit', is_flag=True)
def main(**opts):
    opts = dnnlib.EasyDict(opts)
    from training import configs

    # Under torchrun this process is one worker of WORLD_SIZE; --gpus is then ignored. The device, and whether this
    # machine has a GPU for each of its processes, before anything starts.
    distributed_env = 'RANK' in os.environ and 'WORLD_SIZE' in os.environ
    rank = int(os.environ['RANK']) if distributed_env else 0
    if distributed_env:
        opts.gpus = int(os.environ['WORLD_SIZE'])
    try:
        device = devices.parse_device(opts.device)
    except ValueError as e:
        raise click.ClickException(f'--device: {e}')
    try:
        devices.check_process_count(device, int(os.environ.get('LOCAL_WORLD_SIZE', opts.gpus)))
    except ValueError as e:
        raise click.ClickException(str(e))

    # The snapshot to resume from, and the options that define the experiment: given, else the snapshot's.
    resume = None if opts.resume is None else _load_resume(opts.resume)
    resume_overrides = _experiment_options(opts, resume)

    # Preset, data, and the command line's overrides.
    try:
        cfg = configs.get_config(opts.cfg, norm=opts.norm, loss=opts.loss, cr=opts.cr)
    except ValueError as e:
        raise click.ClickException(str(e))
    if opts.xflip is not None:
        cfg.xflip = opts.xflip
    training_set_kwargs, dataset = _open_dataset(opts.data, use_labels=bool(cfg.conditional))  # 'if-labels' too.
    try:
        args = configs.training_options(
            cfg, resolution=dataset.resolution, channels=dataset.num_channels, label_dim=dataset.label_dim,
            num_gpus=opts.gpus, batch=opts.batch, batch_gpu=opts.batch_gpu, kimg=opts.kimg, steps=opts.steps,
            max_resolution=opts.resolution, cmax=opts.cmax, lod_kimg=opts.lod_kimg, tanh=opts.tanh,
            lr_rampdown=opts.lr_rampdown, precision=opts.precision)
    except ValueError as e:
        raise click.ClickException(str(e))

    # Metrics and reference data.
    metrics = _parse_metrics(opts.metrics)
    metric_kwargs = dnnlib.EasyDict(detector_url=opts.detector, pr_detector_url=opts.pr_detector)
    for option, path in [('--ref-data', opts.ref_data), ('--ref-stats', opts.ref_stats)]:
        if path is not None and not os.path.exists(path):
            raise click.ClickException(f'{option}: no such file or folder: {path}')
    if opts.ref_data is not None:
        metric_kwargs.ref_dataset_kwargs = dict(class_name='training.dataset.ImageFolderDataset', path=os.path.abspath(opts.ref_data))
    if opts.ref_stats is not None:
        metric_kwargs.ref_stats = os.path.abspath(opts.ref_stats)
    if any(m in ('fid50k', 'fid10k') for m in metrics) and opts.ref_data is None and opts.ref_stats is None:
        raise click.ClickException('--metrics=fid50k/fid10k compare with a reference split: give it with --ref-data or --ref-stats')
    from metrics import detectors, frechet_inception_distance, metric_main
    try:
        best_metric = metric_main.best_metric_name(metrics, opts.best_metric)
        if opts.ref_stats is not None:
            frechet_inception_distance.load_ref_stats(opts.ref_stats)  # mu [D] and sigma [D, D], finite.
        if opts.ref_data is not None:
            ref_shape = _open_dataset(opts.ref_data, use_labels=False, option='--ref-data')[1].image_shape
            if list(ref_shape) != list(dataset.image_shape):
                raise ValueError(f'--ref-data holds {ref_shape[2]}x{ref_shape[1]} images with {ref_shape[0]} channel(s), '
                                 f'the training data {dataset.resolution}x{dataset.resolution} with {dataset.num_channels}')
        metric_main.check_detectors(metrics, opts.detector, opts.pr_detector)  # Fetched now, not hours in.
    except (ValueError, detectors.DetectorUnavailableError) as e:
        raise click.ClickException(str(e))

    # Everything the training loop takes.
    if opts.workers is None:
        opts.workers = 3 if device.type == 'cuda' else 0
    args.update(training_set_kwargs=training_set_kwargs, random_seed=opts.seed, num_gpus=opts.gpus, device=str(device),
                deterministic=opts.deterministic,
                num_workers=opts.workers, kimg_per_tick=opts.tick, image_snapshot_ticks=opts.snap,
                network_snapshot_ticks=opts.snap, metrics=metrics, metric_kwargs=metric_kwargs,
                best_metric=best_metric, experiment=dict(cfg=cfg.name, norm=cfg.loss_kwargs.norm, loss=cfg.loss_kwargs.loss,
                                                         cr=cfg.loss_kwargs.cr, precision=opts.precision, seed=opts.seed,
                                                         data=training_set_kwargs.path, xflip=cfg.xflip))
    if resume is not None:
        _check_resume_networks(resume, args, opts)
    dataset_name = os.path.splitext(os.path.basename(os.path.normpath(opts.data)))[0]
    desc = f'{dataset_name}-{cfg.name}-{cfg.loss_kwargs.norm}'

    # Print the options (all of them: training_options.json) and the schedule, last so that it stays in view; a dry
    # run stops here.
    record = dnnlib.util.to_plain(dict(args, resume_pkl=opts.resume, resume_overrides=resume_overrides, run_desc=desc))
    if rank == 0:
        print()
        print('Training options:')
        print(json.dumps(record, indent=2))
        print()
        print(f'Run {desc}: --cfg={cfg.name} --norm={cfg.loss_kwargs.norm} --loss={cfg.loss_kwargs.loss} '
              f'--cr={cfg.loss_kwargs.cr:g} --precision={opts.precision} --seed={opts.seed} '
              f'--xflip={str(cfg.xflip).lower()}, data {opts.data}')
        print('Schedule:')
        for line in dnnlib.util.construct_class_by_name(**args.schedule_kwargs).describe():
            print(f'  {line}')
        print()
    if opts.dry_run:
        if rank == 0:
            print('Dry run (the options above are what training_options.json would hold); exiting.')
        return

    # Run directory.
    _check_outdir(opts.outdir)
    if distributed_env:  # Rank 0 names the run directory and tells the other workers.
        run_dir = [_next_run_dir(opts.outdir, desc) if rank == 0 else None]
        if args.num_gpus > 1:
            _init_process_group('env://', rank=rank, world_size=args.num_gpus,
                                device=devices.process_device(device, _local_rank(rank)))
            torch.distributed.broadcast_object_list(run_dir, src=0)
        args.run_dir = run_dir[0]
    else:
        args.run_dir = _next_run_dir(opts.outdir, desc)
    if rank == 0:
        print(f'Output directory: {args.run_dir}')
        os.makedirs(args.run_dir, exist_ok=False)
        with open(os.path.join(args.run_dir, 'training_options.json'), 'wt') as f:
            json.dump(record, f, indent=2)

    # Launch: one process per GPU (spawned, or started by torchrun), each with the snapshot to resume from.
    args.resume = resume
    if resume is not None and rank == 0:
        print(f'Resuming from "{opts.resume}"')
    if distributed_env:
        if torch.distributed.is_initialized():
            torch.distributed.barrier()  # The run directory exists before any worker writes to it.
        _run_process(rank, args, init_method=None, num_threads=opts.threads)
    elif args.num_gpus == 1:
        _run_process(0, args, init_method=None, num_threads=opts.threads)
    else:
        try:
            torch.multiprocessing.spawn(_run_process, args=(args, f'tcp://127.0.0.1:{_free_port()}', opts.threads),
                                        nprocs=args.num_gpus)
        except torch.multiprocessing.ProcessExitedException as e:
            sys.exit(e.exit_code or 1)  # The process printed its reason.


if __name__ == '__main__':
    main()
