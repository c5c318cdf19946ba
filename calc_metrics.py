"""Evaluate quality metrics of a trained network snapshot.

Examples:

\b
  # FID against the whole training set and Inception Score (the CIFAR-10 numbers of the paper):
  python calc_metrics.py --network=runs/00000-cifar10/network-snapshot-200000.pkl --metrics=fid50k_full,is50k

\b
  # FID of 10k images against the CIFAR-10 test split, on 8 GPUs:
  python calc_metrics.py --network=snap.pkl --metrics=fid10k --ref-data=cifar10-test.zip --gpus=8

\b
  # No internet access: fetch the detector elsewhere, then point to it:
  python calc_metrics.py --network=snap.pkl --detector=/data/inception-2015-12-05.pt

Results are printed as a table and appended as JSON lines to metric-<name>.jsonl next to the snapshot.
Valid metrics: fid50k_full, fid30k_full, fid10k_full, fid50k, fid10k, is50k, kid50k_full, pr50k3_full.
"""

from __future__ import annotations

import os
import socket
import sys

import click
import torch

import dnnlib
from metrics import metric_main, metric_utils
from torch_utils import persistence

#----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _one_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _print_table(results: list[dnnlib.EasyDict]) -> None:
    rows = [('Metric', 'Result', 'Value', 'Time')]
    for result in results:
        for i, (name, value) in enumerate(result.results.items()):
            rows.append((result.metric if i == 0 else '', name, f'{value:.6g}', result.total_time_str if i == 0 else ''))
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
    for row in rows:
        print('  '.join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


def subprocess_fn(rank: int, args: dnnlib.EasyDict) -> None:
    """Evaluate every metric in one process of the group; rank 0 reports. A user-facing problem (no
    detector, missing data) ends the process with exit code 1 after rank 0 prints one line."""
    if args.num_gpus > 1:
        backend = 'nccl' if args.use_cuda else 'gloo'
        torch.distributed.init_process_group(backend=backend, init_method=f'tcp://127.0.0.1:{args.port}',
                                             rank=rank, world_size=args.num_gpus)
        if not args.use_cuda:  # Share the CPU cores between the processes.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.num_gpus))
    device = torch.device('cuda', rank) if args.use_cuda else torch.device('cpu')
    if args.use_cuda:
        torch.cuda.set_device(device)

    progress = (lambda message: print(message, flush=True)) if args.verbose and rank == 0 else None
    results = []
    try:
        for metric in args.metrics:
            result = metric_main.calc_metric(metric=metric, G=args.G, dataset_kwargs=args.dataset_kwargs,
                                             ref_dataset_kwargs=args.ref_dataset_kwargs, num_gpus=args.num_gpus,
                                             rank=rank, device=device, detector_url=args.detector_url,
                                             progress=progress, mirror=args.mirror, num_gen=args.num_gen,
                                             max_real=args.max_real, num_workers=args.num_workers)
            if rank == 0:
                path = metric_main.report_metric(result, run_dir=args.run_dir, snapshot_pkl=args.network_pkl)
                if args.verbose and path is not None:
                    print(f'Appended the result to {path}', flush=True)
            results.append(result)
    except (metric_utils.DetectorUnavailableError, ValueError, OSError) as e:
        if rank == 0:
            print(f'Error: {_one_line(e)}', file=sys.stderr, flush=True)
        raise SystemExit(1)
    finally:
        if args.num_gpus > 1:
            torch.distributed.destroy_process_group()
    if rank == 0:
        _print_table(results)


@click.command(help=__doc__)
@click.option('--network', 'network_pkl', help='Network snapshot: path or URL', metavar='PATH', required=True)
@click.option('--metrics', help='Comma-separated list of metrics', metavar='LIST', default='fid50k_full', show_default=True)
@click.option('--data', help='Training set, zip or folder [default: the snapshot\'s training set]', metavar='PATH')
@click.option('--ref-data', help='Reference split of fid50k / fid10k, zip or folder', metavar='PATH')
@click.option('--mirror', help='Add x-flipped copies of the real images (not the paper protocol)', type=bool,
              is_flag=False, flag_value=True, default=False, metavar='BOOL', show_default=True)
@click.option('--gpus', 'num_gpus', help='Number of processes (GPUs, or CPU processes without CUDA)', type=click.IntRange(min=1),
              default=1, show_default=True, metavar='INT')
@click.option('--detector', 'detector_url', help='Feature detector (TorchScript) for every metric: path or URL '
              '[default: each metric\'s own]', metavar='PATH')
@click.option('--workers', 'num_workers', help='Data loader worker processes per GPU [default: 3, or fewer on fewer CPUs]',
              type=click.IntRange(min=0), metavar='INT')
@click.option('--verbose', help='Print progress', type=bool, default=True, show_default=True, metavar='BOOL')
@click.option('--num-gen', help='Override the number of generated images (tests only)', type=click.IntRange(min=1), hidden=True)
@click.option('--max-real', help='Override the number of real images (tests only)', type=click.IntRange(min=1), hidden=True)
def main(network_pkl: str, metrics: str, data: str | None, ref_data: str | None, mirror: bool, num_gpus: int,
         detector_url: str | None, num_workers: int | None, verbose: bool, num_gen: int | None,
         max_real: int | None) -> None:
    metric_names = [name.strip() for name in metrics.split(',') if name.strip()]
    invalid = [name for name in metric_names if not metric_main.is_valid_metric(name)]
    if invalid or not metric_names:
        raise click.ClickException(f'invalid --metrics: {", ".join(invalid) or "none given"}; '
                                   f'valid metrics: {", ".join(metric_main.list_valid_metrics())}')
    use_cuda = torch.cuda.is_available()
    if use_cuda and num_gpus > torch.cuda.device_count():
        raise click.ClickException(f'--gpus={num_gpus}, but only {torch.cuda.device_count()} GPUs are visible')

    if verbose:
        print(f'Loading network from {network_pkl}...', flush=True)
    try:
        snapshot = persistence.load_snapshot(network_pkl)
    except (persistence.UnsafeSnapshotError, OSError) as e:
        raise click.ClickException(f'cannot load --network: {_one_line(e)}')
    G = snapshot.get('G_ema', snapshot.get('G'))
    if not isinstance(G, torch.nn.Module):
        raise click.ClickException(f'{network_pkl} holds no generator (G_ema or G)')

    if data is not None:
        dataset_kwargs = dnnlib.EasyDict(class_name='training.dataset.ImageFolderDataset', path=data)
    else:
        dataset_kwargs = dnnlib.EasyDict(snapshot.get('training_set_kwargs') or {})
    ref_dataset_kwargs = None
    if ref_data is not None:
        ref_dataset_kwargs = dnnlib.EasyDict(class_name='training.dataset.ImageFolderDataset', path=ref_data)

    args = dnnlib.EasyDict(G=G, network_pkl=network_pkl, metrics=metric_names, dataset_kwargs=dataset_kwargs,
                           ref_dataset_kwargs=ref_dataset_kwargs, mirror=mirror, num_gpus=num_gpus,
                           use_cuda=use_cuda, detector_url=detector_url, num_workers=num_workers, verbose=verbose,
                           num_gen=num_gen, max_real=max_real,
                           run_dir=os.path.dirname(os.path.abspath(network_pkl)) if os.path.isfile(network_pkl) else None)
    if num_gpus == 1:
        subprocess_fn(rank=0, args=args)
        return
    args.port = _free_port()
    try:
        torch.multiprocessing.spawn(fn=subprocess_fn, args=(args,), nprocs=num_gpus)
    except torch.multiprocessing.ProcessExitedException as e:
        if e.error_index != 0:  # Rank 0 has already said what went wrong when it is the one that failed.
            print(f'Error: process {e.error_index} exited with code {e.exit_code}', file=sys.stderr)
        raise SystemExit(1)


if __name__ == '__main__':
    main()
