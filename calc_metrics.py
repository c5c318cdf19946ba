"""Evaluate quality metrics of a trained network snapshot, of an official GN-GAN checkpoint, or of
a folder or zip of images; or write the FID statistics of a dataset.

Examples:

\b
  # FID against the whole training set and Inception Score (the CIFAR-10 numbers of the paper):
  # (cifar10-resnet: 200k G steps x 5 D steps x 64 reals = 64,000 kimg, the snapshot's label)
  python calc_metrics.py --network=training-runs/00000-cifar10-cifar10-resnet-gn/network-snapshot-064000.pkl --metrics=fid50k_full,is50k

\b
  # FID of 10k images against the CIFAR-10 test split, on 8 GPUs:
  python calc_metrics.py --network=snap.pkl --metrics=fid10k --ref-data=cifar10-test.zip --gpus=8

\b
  # FID against the authors' reference statistics, for an official checkpoint:
  python calc_metrics.py --network=best_model.pt --cfg=cifar10-resnet --metrics=fid50k_full,is50k \\
      --ref-stats=cifar10.train.npz

\b
  # Scored as the authors score their CIFAR-10 / STL-10 runs: the trained G (not the EMA), BatchNorm in
  # training mode on batches of 128:
  python calc_metrics.py --network=snap.pkl --metrics=fid50k_full,is50k --generator=G --bn-batch=128

\b
  # Write the statistics of a dataset in the same format (mu, sigma):
  python calc_metrics.py --data=cifar10.zip --write-stats=cifar10.train.npz

\b
  # Images from elsewhere (no network), and FID between two datasets:
  python calc_metrics.py --images=samples/ --metrics=fid50k_full,is50k --data=cifar10.zip
  python calc_metrics.py --images=cifar10-test.zip --metrics=fid10k_full --data=cifar10.zip

\b
  # No internet access: fetch the detectors elsewhere, then point to them:
  python calc_metrics.py --network=snap.pkl --detector=/data/inception-2015-12-05.pt --pr-detector=/data/vgg16.pt

Results are printed as a table and appended as JSON lines to metric-<name>.jsonl next to the snapshot
(printed instead for --images or a URL).
Valid metrics: fid50k_full, fid30k_full, fid10k_full, fid50k, fid10k, fid3k, is50k, kid50k_full, pr50k3_full, lipschitz1k,
lipschitz50k.
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import json
import logging
import os
import shutil
import socket
import sys
import tempfile

import click
import torch

import dnnlib
import legacy
from metrics import detectors, features, frechet_inception_distance, metric_main
from torch_utils import compat, devices, persistence
from torch_utils.threads import set_threads
from training.step import NORMS, LossScore

# Problems of the user's making (no detector, missing, mismatched or unreadable data): one line, exit code 1.
_USER_ERRORS = (detectors.DetectorUnavailableError, ValueError, OSError)

#----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _print_table(results: list[dnnlib.EasyDict]) -> None:
    rows = [('Metric', 'Result', 'Value', 'Time')]
    for result in results:
        for i, (name, value) in enumerate(result.results.items()):
            rows.append((result.metric if i == 0 else '', name, f'{value:.6g}', result.total_time_str if i == 0 else ''))
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
    for row in rows:
        print('  '.join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


def _fail(rank: int, args: dnnlib.EasyDict, message: str) -> None:
    """End this process with exit code 1 after saying why: on stderr when it is the only process, else
    in <error_dir>/<rank> for the parent to print (the others may be killed before they could). One of
    several processes ends at once (os._exit): tearing its process group down while the others still wait
    in a collective could abort it with a C++ runtime message on stderr, beside the one line."""
    if args.num_gpus == 1:
        print(f'Error: {message}', file=sys.stderr, flush=True)
        raise SystemExit(1)
    with open(os.path.join(args.error_dir, str(rank)), 'w') as f:
        f.write(message)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def _run(rank: int, args: dnnlib.EasyDict, device: torch.device) -> None:
    progress = (lambda message: print(message, flush=True)) if args.verbose and rank == 0 else None
    if args.write_stats is not None:
        opts = features.MetricOptions(dataset_kwargs=args.dataset_kwargs, num_gpus=args.num_gpus, rank=rank,
                                      device=device, detector_url=args.detector_url, progress=progress,
                                      mirror=args.mirror, max_real=args.max_real, num_workers=args.num_workers)
        num_images = frechet_inception_distance.write_ref_stats(opts, args.write_stats)
        if rank == 0:
            print(f'Wrote mu and sigma of the Inception features of {num_images} images of '
                  f'{features.data_path(args.dataset_kwargs)} to {args.write_stats}', flush=True)
        return

    results = []
    for metric in args.metrics:
        result = metric_main.calc_metric(metric=metric, G=args.G, dataset_kwargs=args.dataset_kwargs,
                                         ref_dataset_kwargs=args.ref_dataset_kwargs, images_kwargs=args.images_kwargs,
                                         ref_stats=args.ref_stats, num_gpus=args.num_gpus, rank=rank, device=device,
                                         detector_url=args.detector_url, pr_detector_url=args.pr_detector_url,
                                         progress=progress, mirror=args.mirror, num_gen=args.num_gen,
                                         max_real=args.max_real, num_workers=args.num_workers,
                                         generator=args.generator, bn_batch=args.bn_batch, D=args.D,
                                         d_score=None if args.norm is None else LossScore(args.norm))
        if rank == 0:
            path = metric_main.report_metric(result, run_dir=args.run_dir, snapshot_pkl=args.network_pkl)
            if args.verbose and path is not None:
                print(f'Appended the result to {path}', flush=True)
            elif args.verbose:
                print(json.dumps(dnnlib.util.to_plain(result)), flush=True)
        results.append(result)
    if rank == 0:
        _print_table(results)


def subprocess_fn(rank: int, args: dnnlib.EasyDict) -> None:
    """Evaluate every metric, or write the statistics, in one process of the group; rank 0 reports."""
    device = devices.process_device(args.device, rank)
    if args.num_gpus > 1:
        torch.distributed.init_process_group(backend=devices.process_group_backend(device),
                                             init_method=f'tcp://127.0.0.1:{args.port}', rank=rank, world_size=args.num_gpus)
        if device.type == 'cpu' and args.threads is None:  # Share the CPU cores between the processes.
            args.threads = max(1, (os.cpu_count() or 1) // args.num_gpus)
    set_threads(args.threads)
    try:
        _run(rank, args, device)
        if args.num_gpus > 1:
            torch.distributed.barrier()  # Leave together: tearing gloo down while another process still works can abort it.
    except _USER_ERRORS as e:
        _fail(rank, args, dnnlib.util.first_line(e))
    except Exception:
        if args.num_gpus > 1 and os.listdir(args.error_dir):
            raise SystemExit(1)  # The collective broke because another process failed; the parent says why.
        raise
    finally:
        if args.num_gpus > 1:
            compat.destroy_process_group()  # Or left to os._exit below (compat).
    if args.num_gpus > 1:  # One of several processes, its work done: it ends at once. The interpreter's own teardown
        sys.stdout.flush()  # of gloo's threads can abort it with a C++ runtime message ("terminate called without an
        sys.stderr.flush()  # active exception"), as in training/launch.py.
        os._exit(0)


def _spawn(args: dnnlib.EasyDict) -> None:
    """Run subprocess_fn in args.num_gpus processes; if one fails for a user-facing reason, print that
    reason (of the lowest such rank) as one line and exit with code 1."""
    args.port = _free_port()
    args.error_dir = tempfile.mkdtemp(prefix='calc_metrics-errors-')
    logging.getLogger('torch.multiprocessing.spawn').setLevel(logging.ERROR)  # Not "terminating process ...": we say why.
    try:
        torch.multiprocessing.spawn(fn=subprocess_fn, args=(args,), nprocs=args.num_gpus)
    except torch.multiprocessing.ProcessExitedException as e:
        ranks = sorted(int(name) for name in os.listdir(args.error_dir))
        if ranks:
            with open(os.path.join(args.error_dir, str(ranks[0]))) as f:
                message = f.read()
            print(f'Error: {message}' + (f' (process {ranks[0]})' if ranks[0] != 0 else ''), file=sys.stderr)
        else:
            print(f'Error: process {e.error_index} exited with code {e.exit_code}', file=sys.stderr)
        raise SystemExit(1)
    finally:
        shutil.rmtree(args.error_dir, ignore_errors=True)


def _dataset_kwargs(path: str) -> dnnlib.EasyDict:
    return dnnlib.EasyDict(class_name='training.data.dataset.ImageFolderDataset', path=path)

#----------------------------------------------------------------------------


@click.command(help=__doc__)
@click.option('--network', 'network_pkl',             help='Network snapshot, NVIDIA StyleGAN2 pickle, or official GN-GAN checkpoint with --cfg', metavar='PKL|URL', type=str, callback=dnnlib.util.expand_user)
@click.option('--cfg',                                help='Preset of the official checkpoint given as --network',                    type=click.Choice(legacy.official_cfgs()))
@click.option('--images',                             help='Evaluate the images of this folder or zip instead', metavar='ZIP|DIR',     type=str, callback=dnnlib.util.expand_user)
@click.option('--write-stats',                        help='Write FID statistics of --data to this .npz and exit', metavar='NPZ',     type=str, callback=dnnlib.util.expand_user)
@click.option('--metrics',                            help='Metrics, comma-separated', metavar='LIST',                                 type=str, default='fid50k_full', show_default=True)

# Reference data and detectors.
@click.option('--data',                               help='Training set  [default: the snapshot\'s]', metavar='ZIP|DIR',             type=str, callback=dnnlib.util.expand_user)
@click.option('--ref-data',                           help='Reference split of fid50k / fid10k', metavar='ZIP|DIR',                    type=str, callback=dnnlib.util.expand_user)
@click.option('--ref-stats',                          help='FID reference statistics replacing the reals', metavar='NPZ',             type=str, callback=dnnlib.util.expand_user)
@click.option('--generator',                          help='The snapshot\'s generator to score (G: the trained one, as the authors score their small presets)', type=click.Choice(['G_ema', 'G']), default='G_ema', show_default=True)
@click.option('--bn-batch',                           help='Score G in training mode on N images per call: BatchNorm with each batch\'s statistics, as the authors evaluate (N: the preset\'s G batch, 128; BigGAN 50)  [default: eval mode, running statistics]', metavar='N', type=click.IntRange(min=2))
@click.option('--mirror',                             help='Add x-flipped copies of the reals (not the paper\'s protocol)', metavar='BOOL', type=bool, is_flag=False, flag_value=True, default=False, show_default=True)
@click.option('--detector', 'detector_url',           help='Inception-v3 detector of FID, IS, KID  [default: the official one]', metavar='PATH|URL', type=str, callback=dnnlib.util.expand_user)
@click.option('--pr-detector', 'pr_detector_url',     help='VGG16 detector of precision/recall  [default: the official one]', metavar='PATH|URL', type=str, callback=dnnlib.util.expand_user)

# Execution.
@click.option('--gpus', 'num_gpus',                   help='Processes: one per GPU, gloo processes on a CPU', metavar='INT',          type=click.IntRange(min=1), default=1, show_default=True)
@click.option('--device',                             help='cpu, cuda or cuda:N  [default: cuda if there is a GPU]', metavar='DEVICE', type=str)
@click.option('--workers', 'num_workers',             help='DataLoader workers per process  [default: 3, fewer on fewer CPUs]', metavar='INT', type=click.IntRange(min=0))
@click.option('--threads',                            help='CPU threads per process  [default: the cores, shared out]', metavar='INT', type=click.IntRange(min=1))
@click.option('--verbose',                            help='Print progress', metavar='BOOL',                                           type=bool, default=True, show_default=True)
@click.option('--num-gen',                            help='Override the number of generated images (tests only)',                     type=click.IntRange(min=1), hidden=True)
@click.option('--max-real',                           help='Override the number of real images (tests only)',                          type=click.IntRange(min=1), hidden=True)
def main(network_pkl: str | None, cfg: str | None, images: str | None, write_stats: str | None, metrics: str,
         data: str | None, ref_data: str | None, ref_stats: str | None, generator: str, bn_batch: int | None,
         mirror: bool, num_gpus: int, device: str | None,
         detector_url: str | None, pr_detector_url: str | None, num_workers: int | None, threads: int | None, verbose: bool,
         num_gen: int | None, max_real: int | None) -> None:
    if sum(x is not None for x in (network_pkl, images, write_stats)) != 1:
        raise click.ClickException('give one of --network (a generator), --images (a folder or zip of images) '
                                   'or --write-stats (statistics of --data)')
    if cfg is not None and network_pkl is None:
        raise click.ClickException('--cfg goes with --network (an official GN-GAN checkpoint)')
    metric_names = [name.strip() for name in metrics.split(',') if name.strip()]
    invalid = [name for name in metric_names if not metric_main.is_valid_metric(name)]
    if invalid or not metric_names:
        raise click.ClickException(f'invalid --metrics: {", ".join(invalid) or "none given"}; '
                                   f'valid metrics: {", ".join(metric_main.list_valid_metrics())}')
    if ref_stats is not None:
        if write_stats is not None or not any(metric_main.is_fid_metric(name) for name in metric_names):
            raise click.ClickException('--ref-stats replaces the real images of FID metrics: give one in --metrics')
        try:
            frechet_inception_distance.load_ref_stats(ref_stats)
        except ValueError as e:
            raise click.ClickException(f'--ref-stats: {e}')
    if network_pkl is None and (generator != 'G_ema' or bn_batch is not None):
        raise click.ClickException('--generator and --bn-batch choose how a --network is scored: give one')
    if write_stats is not None and data is None:
        raise click.ClickException('--write-stats writes the statistics of --data: give the dataset')
    try:
        device = devices.parse_device(device)
    except ValueError as e:
        raise click.ClickException(f'--device: {e}')
    try:
        devices.check_process_count(device, num_gpus)
    except ValueError as e:
        raise click.ClickException(str(e))

    G, D, norm, dataset_kwargs = None, None, None, dnnlib.EasyDict()
    if network_pkl is not None:
        if verbose:
            print(f'Loading network from {network_pkl}...', flush=True)
        try:
            snapshot = legacy.load_network(network_pkl, cfg)
        except (persistence.UnsafeSnapshotError, legacy.OfficialCheckpointError, OSError) as e:
            raise click.ClickException(f'cannot load --network: {dnnlib.util.first_line(e)}')
        G = snapshot.get(generator, snapshot.get('G') if generator == 'G_ema' else None)
        if not isinstance(G, torch.nn.Module):
            raise click.ClickException(f'{network_pkl} holds no generator {generator}' +
                                       (' (nor G)' if generator == 'G_ema' else ''))
        D = snapshot.get('D') if isinstance(snapshot.get('D'), torch.nn.Module) else None  # For L_D (lipschitz*).
        norm = (snapshot.get('experiment') or {}).get('norm', 'gn' if D is not None else None)
        if norm is not None and norm not in NORMS:
            raise click.ClickException(f'{network_pkl}: its experiment\'s norm {norm!r:.40} is none of {", ".join(NORMS)}')
        dataset_kwargs = dnnlib.EasyDict(snapshot.get('training_set_kwargs') or {})
        path = dataset_kwargs.get('path')
        if data is None and isinstance(path, str) and not os.path.isabs(path) and not os.path.exists(path):
            raise click.ClickException(f'the snapshot\'s training set {path} is a path relative to where the training ran, '
                                       f'and not found from here: give the training set with --data')
    if data is not None:
        dataset_kwargs = _dataset_kwargs(data)

    args = dnnlib.EasyDict(G=G, D=D, norm=norm, network_pkl=network_pkl, metrics=metric_names, dataset_kwargs=dataset_kwargs,
                           ref_dataset_kwargs=_dataset_kwargs(ref_data) if ref_data is not None else None,
                           images_kwargs=_dataset_kwargs(images) if images is not None else None, ref_stats=ref_stats,
                           write_stats=write_stats, mirror=mirror, num_gpus=num_gpus, device=device,
                           detector_url=detector_url, pr_detector_url=pr_detector_url, num_workers=num_workers,
                           threads=threads, verbose=verbose, num_gen=num_gen, max_real=max_real, bn_batch=bn_batch,
                           generator=generator if network_pkl is not None else None,
                           run_dir=os.path.dirname(os.path.abspath(network_pkl)) if network_pkl and os.path.isfile(network_pkl) else None)
    if num_gpus == 1:
        subprocess_fn(rank=0, args=args)
    else:
        _spawn(args)


if __name__ == '__main__':
    main()
