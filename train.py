"""Train a GAN whose discriminator is constrained by gradient normalization (GN).

Examples:

\b
  # Quick start: a small GN-GAN on the embedded 32x32 digits, a few minutes on a CPU.
  python train.py --outdir=training-runs

\b
  # The paper's CIFAR-10 ResNet with GN and hinge loss, FID and IS at each of 40 snapshots.
  python dataset_tool.py --source=cifar-10-python.tar.gz --dest=cifar10.zip
  python train.py --outdir=training-runs --cfg=cifar10-resnet --data=cifar10.zip --tick=32 --snap=50 --metrics=fid50k_full,is50k

\b
  # GN-StyleGAN on CelebA-HQ 1024x1024 with 8 GPUs, progressive growing from 8x8.
  python train.py --outdir=training-runs --cfg=gn-stylegan --data=celebahq-1024.zip --gpus=8

\b
  # Continue a run, to 160 kimg: every other option as in the snapshot.
  python train.py --resume=training-runs/00002-celebahq-1024-gn-stylegan-gn/network-snapshot-000080.pkl --kimg=160

\b
  # Fine-tune the networks of a StyleGAN2 pickle of NVIDIA's code with GN (docs/nvidia-pickles.md).
  python train.py --outdir=training-runs --cfg=gn-stylegan2 --data=metfaces-1024.zip --resume=stylegan2-ffhq-1024x1024.pkl

\b
  # A job that a cluster may stop and requeue: the same command continues its own run.
  python train.py --outdir=training-runs --cfg=cifar10-resnet --data=cifar10.zip --resume=latest

The options of the experiment (--cfg, --data and --norm to --style-mixing below), the length and the
batches (--batch-gpu included) default, with --resume=PKL, to the snapshot's; an experiment option
that differs from the snapshot's needs --resume-override. --resume=latest continues, in its own
directory, the newest run in --outdir of the experiment this command describes (from its newest
complete snapshot), or starts one. --resume of a StyleGAN2 pickle of NVIDIA's code starts a new run of
the command line's experiment from its networks (G, G_ema, and D unless --resume-fresh-d), read as
data, with fresh optimizers and counters.
A run's options, every default filled in, are printed first and written to training_options.json in
its directory.

SIGTERM or SIGUSR1 (a cluster's time limit or preemption) stops a run after the G step in progress,
with a snapshot, one line saying how to continue, and exit status 75; a second signal ends it at once.
Out of GPU memory ends it with one line naming a --batch-gpu that lowers the memory, and exit status 1.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import multiprocessing
import os
import shlex
import signal
import socket
import sys

if __name__ == '__main__':  # SIGTERM and SIGUSR1 wait while Python starts up, until main() takes them (StopSignal).
    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGUSR1))

from torch_utils.threads import set_threads, set_wait_policy  # noqa: E402

set_wait_policy()  # Before torch is imported (torch_utils/threads.py).

from torch_utils.compat import require_supported_torch  # noqa: E402

require_supported_torch()  # One line on a torch older than the oldest supported, before any work.

import click  # noqa: E402
import torch  # noqa: E402

import dnnlib  # noqa: E402
from torch_utils import compat, devices, persistence  # noqa: E402
from training.data.dataset import ImageFolderDataset  # noqa: E402
from training.experiment import CONTINUED, IDENTITY, QUICKSTART_DATA, Experiment  # noqa: E402
from training.recipes.stylegan2 import SPECS as SG2_SPECS  # noqa: E402
from training.run import run_dirs, write_failure  # noqa: E402
from training.run.stop_signal import EXIT_STOPPED, RunStopped, StopRequested, StopSignal, shared_request  # noqa: E402
from training.step.loss import LOSSES, NORMS  # noqa: E402
from training.step.precision import PRECISIONS  # noqa: E402
from training.step.graphs import CudaGraphsBroken  # noqa: E402
from training.step.training_step import CUDA_GRAPHS  # noqa: E402

# The command line's options that Experiment.build takes as they are.
EXPERIMENT_OPTIONS = IDENTITY + ('batch', 'batch_gpu', 'steps', 'kimg', 'lod_kimg', 'lr_rampdown', 'deterministic', 'cuda_graphs',
                                 'workers')
LEAVE_GRACE_S = 10  # --gpus=N: how long the others may take to end after one process ended (before SIGTERM, SIGKILL).

#----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _end_with_parent() -> None:
    """Have Linux send this spawned process SIGTERM when train.py's own process ends, however it ends (`kill -9`,
    the out-of-memory killer): it stops after its G step with a snapshot, as on a signal that train.py passes on.
    torch's spawn asks for SIGINT instead, which a process started in the background by a script
    (`nohup python train.py ... &`) ignores: its workers trained on by themselves."""
    if not sys.platform.startswith('linux'):
        return
    PR_SET_PDEATHSIG = 1  # <sys/prctl.h>
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    parent = torch.multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # Ended before the request was made.
        sys.exit(1)


def _run_process(rank: int, run: dnnlib.EasyDict, init_method: str | None, num_threads: int | None,
                 stop: StopSignal | None = None) -> None:
    """One training process: spawned by --gpus=N (init_method given), train.py's own, or a torchrun worker, training
    run.experiment into run.run_dir (from run.resume, a snapshot or None) on its share of the experiment's device
    (torch_utils/devices.py), with `num_threads` CPU threads (None: the cores shared out between the
    processes on a CPU, torch's default on a GPU), stopped by `stop`: train.py's own, or for a spawned process one
    that shares run.stop_shared with it, entered first of all (the process started with the signals blocked,
    StopSignal.blocked, and entering it lets them through).

    A run that diverges, meets a bad image, runs out of GPU memory or cannot write its results ends with one line
    on stderr and exit status 1; its run directory keeps the log and the last complete snapshot (a file that cannot
    be written, a full disk: the line names the file, that snapshot and the command that continues the run,
    training/run/write_failure.py). A run stopped by a signal (training/run/stop_signal.py) says in one line where
    its snapshot is and which command continues it (run.continue_args, with --resume of that snapshot or 'latest'),
    and exits with EXIT_STOPPED.
    """
    stop = StopSignal(run.get('stop_shared')) if stop is None else stop
    try:
        with stop:
            if init_method is not None:  # Spawned by --gpus=N.
                _end_with_parent()
            _train_process(rank, run, init_method, num_threads, stop)
    except SystemExit as e:
        if run.experiment.gpus == 1:
            raise
        code = e.code if isinstance(e.code, int) else 1
    else:
        code = 0
    if run.experiment.gpus > 1:  # One of several processes (spawned or torchrun's): its work is done, its files closed,
        sys.stdout.flush()       # so it ends at once. The interpreter's own teardown of gloo's threads could abort it
        sys.stderr.flush()       # with a C++ runtime message, and a group left to it (compat) would be destroyed there.
        os._exit(code)


def _train_process(rank: int, run: dnnlib.EasyDict, init_method: str | None, num_threads: int | None,
                   stop: StopSignal) -> None:
    """The body of _run_process."""
    from training import training_loop
    from training.data.dataset import DatasetError
    from training.run.out_of_memory import OutOfMemory
    from training.run.reporter import TrainingDiverged
    num_gpus = run.experiment.gpus
    device = devices.process_device(torch.device(run.experiment.device), _local_rank(rank))
    if device.type == 'cpu' and num_threads is None and num_gpus > 1:
        num_threads = max(1, (os.cpu_count() or 1) // num_gpus)
    set_threads(num_threads)
    if num_gpus > 1 and not torch.distributed.is_initialized():
        _init_process_group(init_method, rank=rank, world_size=num_gpus, device=device)
    if init_method is not None and sys.platform.startswith('linux'):
        # DataLoader workers start by fork, as those of a single process do: they inherit the stop signal's handler,
        # which ignores a scheduler's signal in them. Spawned (what a spawned process would do by default), a worker
        # that such a signal ends as it starts leaves its parent waiting forever to send it its start-up data.
        multiprocessing.set_start_method('fork', force=True)
    logger = dnnlib.util.Logger(os.path.join(run.run_dir, 'log.txt')) if rank == 0 else None
    try:
        training_loop.training_loop(run.experiment, run_dir=run.run_dir, device=str(device), rank=rank, resume=run.resume,
                                    initial=run.initial, stop=stop)
        if torch.distributed.is_initialized():
            torch.distributed.barrier()  # Leave together: tearing gloo down while another process still writes can abort it.
    except RunStopped as e:
        if rank == 0:
            snapshot = e.snapshot or run.resume_pkl
            continue_args = run.continue_args + [f'--resume={snapshot if run.resume_pkl_given else "latest"}']
            print(f'Stopped by {e.signal_name} after G step {e.step}, snapshot {snapshot}; continue with: {continue_args[0]} '
                  f'{shlex.join(continue_args[1:])}', flush=True)
        if torch.distributed.is_initialized():
            torch.distributed.barrier()  # Leave together, once process 0 has written the snapshot.
        sys.exit(EXIT_STOPPED)
    except dnnlib.util.WriteError as e:  # A full disk: what, the newest snapshot, how to go on (training/run/write_failure.py).
        with contextlib.suppress(dnnlib.util.WriteError):  # log.txt, if full, leaves the line to the console.
            print(f'Error: {write_failure.explain(e, run.run_dir, run.continue_args)}', file=sys.stderr, flush=True)
        sys.exit(1)
    except (TrainingDiverged, DatasetError, OutOfMemory, CudaGraphsBroken, OSError) as e:
        print(f'Error: {e}', file=sys.stderr, flush=True)
        sys.exit(1)
    finally:
        if logger is not None:
            logger.close()
        if torch.distributed.is_initialized():
            compat.destroy_process_group()


def _local_rank(rank: int) -> int:
    """This process's index among the processes of its machine (torchrun says; --gpus=N spawns them all here)."""
    return int(os.environ.get('LOCAL_RANK', rank))


def _init_process_group(init_method: str, rank: int, world_size: int, device: torch.device) -> None:
    torch.distributed.init_process_group(devices.process_group_backend(device), init_method=init_method, rank=rank,
                                         world_size=world_size)


def _open_dataset(data: str, use_labels: bool, option: str = '--data') -> ImageFolderDataset:
    """Open and check the training data (or the reference data of `option`): labels only for conditional presets."""
    if not os.path.exists(data):
        raise click.ClickException(f'{option}: no such file or folder: {data}')
    try:
        dataset = ImageFolderDataset(path=os.path.abspath(data), use_labels=use_labels)
        dataset.validate()  # Every image's header (size, channels, bit depth), before a run directory exists.
    except (OSError, ValueError) as e:
        raise click.ClickException(f'{option}: {e}')
    return dataset


def _load_nvidia(opts: dnnlib.EasyDict, stop: StopSignal) -> dnnlib.EasyDict | None:
    """With --resume of a StyleGAN2 pickle of NVIDIA's code: the networks a new run starts from (G, G_ema, and D
    unless --resume-fresh-d), read as data (torch_utils/nvidia_pickle.py), which a stop request interrupts; else None."""
    from torch_utils import nvidia_pickle

    def interrupt() -> None:
        if stop.requested():
            raise StopRequested(signal.Signals(stop.requested()).name)
    if opts.resume is None or opts.resume == 'latest':
        nvidia = False
    else:
        try:
            with dnnlib.util.open_url(opts.resume, verbose=False) as f:
                nvidia = nvidia_pickle.is_pickle(f)
                networks = nvidia_pickle.load_network_pickle(f, opts.resume, interrupt=interrupt) if nvidia else None
        except (OSError, persistence.UnsafeSnapshotError) as e:
            raise click.ClickException(f'--resume: {e}')
        except StopRequested as e:  # Before anything of the run is written: the same command starts it again.
            print(f'Stopped by {e} while reading --resume={opts.resume}; nothing was started', file=sys.stderr, flush=True)
            sys.exit(EXIT_STOPPED)
    if not nvidia:
        if opts.resume_fresh_d:
            raise click.ClickException('--resume-fresh-d goes with --resume of a StyleGAN2 pickle of NVIDIA\'s code')
        return None
    if opts.resume_override:
        raise click.ClickException(f'--resume-override: {opts.resume} is NVIDIA\'s pickle, which records no experiment: '
                                   f'this run\'s options are the command line\'s')
    if 'G' not in networks or ('D' not in networks and not opts.resume_fresh_d):
        raise click.ClickException(f'--resume: {opts.resume} holds no {"G" if "G" not in networks else "D"}'
                                   f'{"" if "G" not in networks else "; add --resume-fresh-d to start D from scratch"}')
    names = ('G', 'G_ema') if opts.resume_fresh_d else ('G', 'G_ema', 'D')
    return dnnlib.EasyDict({name: networks.get(name, networks.G) for name in names})


def _load_resume(resume: str) -> dnnlib.EasyDict:
    """The snapshot to continue from, loaded once for the whole run; refused in one line if it is unreadable or
    has no optimizer state and progress (not written by train.py)."""
    from training.run.run_state import load_resumable
    persistence.remove_stale_temporaries(os.path.dirname(os.path.abspath(resume)))  # Left by a killed writer.
    try:
        return load_resumable(resume)
    except (OSError, ValueError, persistence.UnsafeSnapshotError) as e:
        raise click.ClickException(f'--resume: {e}')


def _experiment(opts: dnnlib.EasyDict, device: torch.device, snapshot: dnnlib.EasyDict | None) -> tuple[Experiment, list[str]]:
    """The run's Experiment: the command line's options, and for those of the experiment and its length (IDENTITY,
    CONTINUED) that it leaves out, the resumed snapshot's. A resumed run refuses, in one line, an experiment that
    differs from its snapshot's, unless --resume-override; returns those changes ('--norm=gp1 (was gn)')."""
    try:
        recorded = None if snapshot is None else Experiment.from_snapshot(snapshot)
    except (ValueError, TypeError) as e:
        raise click.ClickException(f'--resume: {opts.resume}: {e}')
    options = {name: opts[name] for name in EXPERIMENT_OPTIONS}
    if options['data'] is not None:
        options['data'] = os.path.abspath(options['data'])  # Snapshots work from any folder.
    if recorded is not None:
        length_given = options['steps'] is not None or options['kimg'] is not None
        options.update({name: getattr(recorded, name) for name in IDENTITY + CONTINUED
                        if options[name] is None and not (length_given and name in ('steps', 'kimg'))})
    options['data'] = options['data'] or QUICKSTART_DATA
    try:
        use_labels = Experiment.reads_labels(options['cfg'] or Experiment.cfg)
    except ValueError as e:
        raise click.ClickException(str(e))
    dataset = _open_dataset(options['data'], use_labels)
    try:
        experiment = Experiment.build(**options, img_resolution=dataset.resolution, img_channels=dataset.num_channels,
                                      label_dim=dataset.label_dim, gpus=opts.gpus, device=str(device))
    except ValueError as e:
        raise click.ClickException(str(e))
    changes = [] if recorded is None else recorded.changes(experiment)
    if changes and not opts.resume_override:
        raise click.ClickException(f'--resume: {opts.resume} was trained with other options: {"; ".join(changes)}; leave '
                                   f'them out to take the snapshot\'s, or add --resume-override to change them on purpose')
    return experiment, changes


def _check_resume_networks(snapshot: dnnlib.EasyDict, experiment: Experiment, path: str) -> None:
    """Refuse, in one line, a snapshot whose networks (class, parameter names and shapes) are not the ones this run
    builds, naming (for networks of the run's class) the constructor kwargs in which they differ."""
    for name, kwargs in [('G', experiment.G_kwargs), ('G_ema', experiment.G_kwargs), ('D', experiment.D_kwargs)]:
        net = snapshot.get(name)
        if net is None:
            continue
        shapes = {key: tuple(tensor.shape) for key, tensor in net.state_dict().items()}
        if persistence.class_name_of(type(net)) != kwargs.class_name or shapes != persistence.network_shapes(kwargs):
            differences = f'; it is a {persistence.class_name_of(type(net))}, this run\'s a {kwargs.class_name}' \
                if persistence.class_name_of(type(net)) != kwargs.class_name else \
                _kwargs_differences(net.init_kwargs, {k: v for k, v in kwargs.items() if k != 'class_name'})
            raise click.ClickException(f'--resume: the {name} of {path} is not the network that --cfg={experiment.cfg} '
                                       f'builds with these options for this data{differences}')


def _kwargs_differences(theirs: dict, ours: dict) -> str:
    """'; its kwargs differ: mapping_kwargs.num_layers 8 (this run: 2), ...' for two nested kwargs dicts (those set on one
    side only last), or ''."""
    def flat(d: dict, prefix: str = '') -> dict:
        return {k2: v2 for k, v in d.items() for k2, v2 in (flat(v, f'{prefix}{k}.') if isinstance(v, dict) else
                                                             {f'{prefix}{k}': v}).items()}
    a, b = flat(dnnlib.util.to_plain(theirs)), flat(dnnlib.util.to_plain(ours))
    keys = sorted((k for k in set(a) | set(b) if a.get(k, '(unset)') != b.get(k, '(unset)')), key=lambda k: (k not in a or k not in b, k))
    listed = ', '.join(f'{k} {a.get(k, "(unset)")} (this run: {b.get(k, "(unset)")})' for k in keys[:4])
    return f'; its kwargs differ: {listed}{", ..." if len(keys) > 4 else ""}' if keys else ''


def _without_resume(args: list[str]) -> list[str]:
    """The command-line arguments `args` without --resume, --resume-override and --resume-fresh-d."""
    kept, skip = [], False
    for arg in args:
        if not skip and arg not in ('--resume', '--resume-override', '--resume-fresh-d') and not arg.startswith('--resume='):
            kept.append(arg)
        skip = arg == '--resume'  # Its value is the next argument.
    return kept


def _check_outdir(outdir: str) -> None:
    """Refuse an --outdir that is a file, or a folder (or the nearest existing parent) that cannot be written."""
    if os.path.exists(outdir) and not os.path.isdir(outdir):
        raise click.ClickException(f'--outdir: {outdir} is a file, not a folder')
    existing = os.path.abspath(outdir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise click.ClickException(f'--outdir: cannot write to {existing}')


def _group_size_note(experiment: Experiment) -> str | None:
    """One line when --gpus makes D's minibatch-stddev groups smaller than on one GPU. A D call groups min(group size,
    its samples) samples (training/networks/stylegan.py), so a per-GPU share below the group size changes what D
    computes. Said, not refused: StyleGAN v1 shrinks its groups the same way, and no --batch-gpu can restore them."""
    schedule = experiment.schedule
    if experiment.gpus == 1 or schedule.group_size == 1:
        return None
    if not hasattr(schedule, 'levels'):  # One batch for the whole run (gn-stylegan2).
        n, one = min(schedule.group_size, schedule.batch_gpu_D), min(schedule.group_size, schedule.batch_D)
        return None if n >= one else (f'Note: --gpus={experiment.gpus} shrinks D\'s minibatch-stddev groups, as a GPU\'s '
                                      f'share of the batch is smaller than a group: {n} instead of {one} samples')
    spans = []  # [samples per group, on one GPU, first resolution, last resolution]
    for r in schedule.levels:
        n, one = min(schedule.group_size, schedule.batch_gpu[r]), min(schedule.group_size, schedule.batch[r])
        if n < one and spans and spans[-1][:2] == [n, one] and spans[-1][3] * 2 == r:
            spans[-1][3] = r
        elif n < one:
            spans.append([n, one, r, r])
    if not spans:
        return None
    where = ', '.join(f'{n} instead of {one} samples at {lo}x{lo}' + (f'-{hi}x{hi}' if hi > lo else '')
                      for n, one, lo, hi in spans)
    return (f'Note: --gpus={experiment.gpus} shrinks D\'s minibatch-stddev groups, as a GPU\'s share of the batch is '
            f'smaller than a group: {where}')


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

# Main options.
@click.option('--outdir',       help='Where to make the run directory', metavar='DIR',                            type=str, default='training-runs', show_default=True, callback=dnnlib.util.expand_user)
@click.option('--cfg',          help='Preset: network, loss, optimizer, schedule (docs/configs.md)  [default: quickstart]', type=str)
@click.option('--data',         help='Training data, made by dataset_tool.py  [default: the embedded digits]', metavar='ZIP|DIR', type=str, callback=dnnlib.util.expand_user)
@click.option('--gpus',         help='Processes: one per GPU, gloo processes on a CPU', metavar='INT',          type=click.IntRange(min=1), default=1, show_default=True)
@click.option('--device',       help='cpu, cuda or cuda:N  [default: cuda if there is a GPU]', metavar='DEVICE',  type=str)

# The experiment: with --resume, each defaults to the snapshot's.
@click.option('--norm',         help='Discriminator constraint  [default: gn]',                                   type=click.Choice(NORMS))
@click.option('--loss',         help='Adversarial loss  [default: the preset\'s]',                                type=click.Choice(LOSSES))
@click.option('--cr',           help='Consistency regularization weight (paper: 5)  [default: 0]', metavar='FLOAT', type=click.FloatRange(min=0))
@click.option('--precision',    help='Arithmetic of the networks (docs/precision.md)  [default: tf32]',          type=click.Choice(PRECISIONS))
@click.option('--seed',         help='Random seed  [default: 0]', metavar='INT',                                 type=click.IntRange(min=0))
@click.option('--xflip',        help='Mirror the reals left-right at random  [default: the preset\'s]', metavar='BOOL', type=bool)
@click.option('--glr',          help='G learning rate  [default: the preset\'s]', metavar='FLOAT',                type=click.FloatRange(min=0, min_open=True))
@click.option('--dlr',          help='D learning rate  [default: the preset\'s]', metavar='FLOAT',                type=click.FloatRange(min=0, min_open=True))
@click.option('--gamma',        help='R1 weight, with --norm=r1  [default: 10; gn-stylegan2: its --sg2-cfg\'s]', metavar='FLOAT', type=click.FloatRange(min=0))
@click.option('--resolution',   help='gn-stylegan: final resolution  [default: the data\'s]', metavar='INT',     type=click.IntRange(min=1))
@click.option('--cmax',         help='gn-stylegan(2): feature-map cap of G and D  [default: 512]', metavar='INT', type=click.IntRange(min=1))
@click.option('--d-cmax',       help='gn-stylegan(2): feature-map cap of D  [default: --cmax]', metavar='INT',   type=click.IntRange(min=1))
@click.option('--tanh',         help='gn-stylegan: G\'s images through tanh  [default: false]', metavar='BOOL',  type=bool)
@click.option('--map-dim',      help='gn-stylegan(2): width of z, w and the mapping network  [default: 512]', metavar='INT', type=click.IntRange(min=1))
@click.option('--map-lrmul',    help='gn-stylegan: mapping network lr multiplier  [default: 0.01]', metavar='FLOAT', type=click.FloatRange(min=0, min_open=True))
@click.option('--style-mixing', help='gn-stylegan(2): style mixing probability  [default: 0.9; sg2-cfg cifar: 0]', metavar='FLOAT', type=click.FloatRange(min=0, max=1))
@click.option('--sg2-cfg',      help='gn-stylegan2: NVIDIA StyleGAN2-ADA\'s configuration (docs/configs.md)  [default: auto]', type=click.Choice(list(SG2_SPECS)))
@click.option('--pl-weight',    help='gn-stylegan2: path length regularization weight  [default: 2; sg2-cfg cifar: 0]', metavar='FLOAT', type=click.FloatRange(min=0))
@click.option('--act',          help='Standard CNN: D\'s activation, relu, lrelu[:SLOPE], elu, softplus[:BETA]  [default: lrelu:0.1]', metavar='ACT', type=str)
@click.option('--depth',        help='Standard CNN: number of convolutional layers of G and D, 3 to 16 (docs/results.md)  [default: G 4, D 7]', metavar='INT', type=click.IntRange(min=1))

# Length and batches.
@click.option('--batch',        help='Global D batch M; gn-stylegan: cap on the minibatch', metavar='INT',       type=click.IntRange(min=1))
@click.option('--batch-gpu',    help='Most samples per GPU at once; the rest accumulates', metavar='INT',        type=click.IntRange(min=1))
@click.option('--kimg',         help='Run length in thousands of real images', metavar='KIMG',                  type=click.FloatRange(min=0, min_open=True))
@click.option('--steps',        help='Run length in G steps (fixed-batch presets)', metavar='INT',              type=click.IntRange(min=1))
@click.option('--lod-kimg',     help='gn-stylegan: kimg per phase and per fade-in  [default: 600]', metavar='KIMG', type=click.FloatRange(min=0, min_open=True))
@click.option('--lr-rampdown',  help='gn-stylegan: kimg of linear lr decay at the end  [default: 0]', metavar='KIMG', type=click.FloatRange(min=0))

# Reporting.
@click.option('--tick',         help='Progress line every this many kimg', metavar='KIMG',                      type=click.FloatRange(min=0, min_open=True), default=4, show_default=True)
@click.option('--snap',         help='Grid, metrics and snapshot every this many ticks', metavar='TICKS',       type=click.IntRange(min=1), default=50, show_default=True)
@click.option('--metrics',      help='Metrics at every snapshot, comma-separated, or none', metavar='LIST',    type=str, default='none', show_default=True)
@click.option('--ref-data',     help='Reference split of fid50k / fid10k', metavar='ZIP|DIR',                   type=str, callback=dnnlib.util.expand_user)
@click.option('--ref-stats',    help='FID reference statistics replacing the reals', metavar='NPZ',            type=str, callback=dnnlib.util.expand_user)
@click.option('--best-metric',  help='FID metric that picks network-best.pkl  [default: the first FID]', metavar='NAME', type=str)
@click.option('--detector',     help='Inception-v3 detector of FID, IS, KID', metavar='PATH|URL',               type=str, callback=dnnlib.util.expand_user)
@click.option('--pr-detector',  help='VGG16 detector of precision/recall', metavar='PATH|URL',                   type=str, callback=dnnlib.util.expand_user)

# Resuming and execution.
@click.option('--resume',       help='Continue a snapshot\'s run, or latest: this experiment\'s newest run in --outdir; or start from an NVIDIA StyleGAN2 pickle', metavar='PKL|latest', type=str, callback=dnnlib.util.expand_user)
@click.option('--resume-override', help='With --resume=PKL: accept experiment options that differ from the snapshot\'s', is_flag=True)
@click.option('--resume-fresh-d', help='With --resume of NVIDIA\'s pickle: start D from scratch, not from the pickle\'s', is_flag=True)
@click.option('--deterministic', help='Repeatable GPU arithmetic (slower)',                                     is_flag=True)
@click.option('--cuda-graphs',  help='Replay the training steps as CUDA graphs: auto (one GPU, not fp16), on, off (docs/ops.md)', type=click.Choice(CUDA_GRAPHS), default='auto', show_default=True)
@click.option('--threads',      help='CPU threads per process  [default: the cores, shared out]', metavar='INT', type=click.IntRange(min=1))
@click.option('--workers',      help='DataLoader workers per process  [default: 3 on CUDA, 0 on a CPU]', metavar='INT', type=click.IntRange(min=0))
@click.option('--dry-run',      help='Print the options and the schedule, and exit',                            is_flag=True)
def main(**opts):
    # A signal from here on stops the run (training/run/stop_signal.py); one that arrives while it starts stops it at its
    # first G step boundary, with a snapshot.
    with StopSignal(shared_request()) as stop:
        _train(dnnlib.EasyDict(opts), stop)


def _train(opts: dnnlib.EasyDict, stop: StopSignal) -> None:
    """train.py with the command line's options `opts`, stopped by `stop`."""
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

    # The experiment: the command line's options, else the resumed snapshot's, else the preset's and the defaults.
    # --resume=latest: the command line's alone, whose newest run in --outdir continues in place (or a new one starts).
    latest = opts.resume == 'latest'
    if latest and opts.resume_override:
        raise click.ClickException('--resume-override goes with --resume=PKL: --resume=latest continues a run of this '
                                   'very experiment')
    initial = _load_nvidia(opts, stop)  # NVIDIA's networks to start from, or None.
    resume = None if opts.resume is None or latest or initial is not None else _load_resume(opts.resume)
    experiment, resume_overrides = _experiment(opts, device, resume)
    continuation = run_dirs.find_latest(opts.outdir, experiment, print if rank == 0 else lambda _: None) if latest else None
    resume_pkl = continuation.snapshot_pkl if continuation is not None else None if latest else opts.resume
    if continuation is not None:
        resume = continuation.snapshot
    if resume is not None or initial is not None:
        _check_resume_networks(resume or initial, experiment, resume_pkl)

    # Metrics and reference data.
    metrics = _parse_metrics(opts.metrics)
    for option, path in [('--ref-data', opts.ref_data), ('--ref-stats', opts.ref_stats)]:
        if path is not None and not os.path.exists(path):
            raise click.ClickException(f'{option}: no such file or folder: {path}')
    if any(m in ('fid50k', 'fid10k') for m in metrics) and opts.ref_data is None and opts.ref_stats is None:
        raise click.ClickException('--metrics=fid50k/fid10k compare with a reference split: give it with --ref-data or --ref-stats')
    from metrics import detectors, frechet_inception_distance, metric_main
    try:
        best_metric = metric_main.best_metric_name(metrics, opts.best_metric)
        if opts.ref_stats is not None:
            frechet_inception_distance.load_ref_stats(opts.ref_stats)  # mu [D] and sigma [D, D], finite.
        if opts.ref_data is not None:
            ref_shape = _open_dataset(opts.ref_data, use_labels=False, option='--ref-data').image_shape
            if list(ref_shape) != [experiment.img_channels, experiment.img_resolution, experiment.img_resolution]:
                raise ValueError(f'--ref-data holds {ref_shape[2]}x{ref_shape[1]} images with {ref_shape[0]} channel(s), '
                                 f'the training data {experiment.img_resolution}x{experiment.img_resolution} with '
                                 f'{experiment.img_channels}')
        metric_main.check_detectors(metrics, opts.detector, opts.pr_detector)  # Fetched now, not hours in.
    except (ValueError, detectors.DetectorUnavailableError) as e:
        raise click.ClickException(str(e))
    absolute = lambda path: None if path is None else os.path.abspath(path)
    experiment = experiment.replace(metrics=tuple(metrics), best_metric=best_metric, tick=opts.tick, snap=opts.snap,
                                    ref_data=absolute(opts.ref_data), ref_stats=absolute(opts.ref_stats),
                                    detector=opts.detector, pr_detector=opts.pr_detector)

    # Print the options (all of them: training_options.json) and the schedule, last so that it stays in view; a dry
    # run stops here.
    desc = experiment.description
    record = dnnlib.util.to_plain(dict(
        experiment.record(), resume_pkl=resume_pkl, resume_overrides=resume_overrides, run_desc=desc,
        training_set_kwargs=experiment.training_set_kwargs, G_kwargs=experiment.G_kwargs, D_kwargs=experiment.D_kwargs,
        G_opt_kwargs=experiment.G_opt_kwargs, D_opt_kwargs=experiment.D_opt_kwargs, loss_kwargs=experiment.loss_kwargs,
        schedule_kwargs=experiment.schedule_kwargs))
    if rank == 0:
        print()
        print('Training options:')
        print(json.dumps(record, indent=2))
        print()
        print(f'Run {desc}: {experiment.flags()}')
        print('Schedule:')
        for line in experiment.schedule.describe():
            print(f'  {line}')
        if (note := _group_size_note(experiment)) is not None:
            print(note)
        print()
        if latest:
            print(f'--resume=latest: continuing {continuation.run_dir} from {continuation.snapshot_pkl}' if continuation else
                  f'--resume=latest: no run of this experiment in {opts.outdir}; starting one')
    if opts.dry_run:
        if rank == 0:
            print('Dry run (the options above are what training_options.json would hold); exiting.')
        return

    # Run directory: a new one, or the one --resume=latest continues, without the records of what it redoes.
    _check_outdir(opts.outdir)
    run_dir = continuation.run_dir if continuation is not None else None
    if distributed_env:  # Rank 0 names the run directory and tells the other workers.
        chosen = [run_dir or (run_dirs.next_run_dir(opts.outdir, desc) if rank == 0 else None), resume_pkl]
        if experiment.gpus > 1:
            _init_process_group('env://', rank=rank, world_size=experiment.gpus,
                                device=devices.process_device(device, _local_rank(rank)))
            torch.distributed.broadcast_object_list(chosen, src=0)
        if chosen[1] != resume_pkl and initial is None:  # This node saw --outdir otherwise (a shared file system's delay): rank 0 decides.
            resume = None if chosen[1] is None else _load_resume(chosen[1])
        run_dir, resume_pkl = chosen
    elif run_dir is None:
        run_dir = run_dirs.next_run_dir(opts.outdir, desc)
    continue_args = [f'python {sys.argv[0]}' if not distributed_env else f'(the same launcher) {sys.argv[0]}',
                     *_without_resume(sys.argv[1:])]
    if rank == 0 and continuation is None:
        print(f'Output directory: {run_dir}')
        os.makedirs(run_dir, exist_ok=False)
        try:
            with dnnlib.util.writing(path := os.path.join(run_dir, 'training_options.json')), \
                    dnnlib.util.atomic_path(path) as tmp, open(tmp, 'wt') as f:
                json.dump(record, f, indent=2)
        except dnnlib.util.WriteError as e:
            os.rmdir(run_dir)  # Left empty: nothing of the run remains.
            raise click.ClickException(write_failure.explain(e, None, continue_args)) from None
    elif rank == 0:
        print(f'Output directory: {run_dir} (continued)')
        progress = resume['progress']
        try:
            dropped = run_dirs.drop_records_after(run_dir, progress['step'], progress['cur_nimg'])
        except dnnlib.util.WriteError as e:
            raise click.ClickException(write_failure.explain(e, run_dir, continue_args)) from None
        if dropped:
            print(f'Dropped {dropped} record(s) of stats.jsonl and metric-*.jsonl from after the snapshot: they are redone')

    # Launch: one process per GPU (spawned, or started by torchrun), each with the snapshot to resume from; the command
    # that continues the run if a signal stops it.
    if resume is not None and rank == 0:
        print(f'Resuming from "{resume_pkl}"')
    if initial is not None and rank == 0:
        differences = _kwargs_differences(initial.G.init_kwargs, {k: v for k, v in experiment.G_kwargs.items() if k != 'class_name'})
        print(f'Starting from the {", ".join(initial)} of "{resume_pkl}"{" (D from scratch)" if "D" not in initial else ""}'
              f'{differences.replace("; its kwargs differ", "; this run builds G with other kwargs, the same tensors")}')
    run = dnnlib.EasyDict(experiment=experiment, run_dir=run_dir, resume=resume, initial=initial, resume_pkl=resume_pkl,
                          resume_pkl_given=opts.resume is not None and not latest, continue_args=continue_args,
                          stop_shared=stop.shared)
    if distributed_env:
        if torch.distributed.is_initialized():
            torch.distributed.barrier()  # The run directory exists before any worker writes to it.
        _run_process(rank, run, init_method=None, num_threads=opts.threads, stop=stop)
    elif experiment.gpus == 1:
        _run_process(0, run, init_method=None, num_threads=opts.threads, stop=stop)
    else:  # A stop request goes on to the processes (run.stop_shared); a second signal kills them. When one process
           # ends, the others have LEAVE_GRACE_S to end by themselves.
        with stop.blocked():
            context = torch.multiprocessing.start_processes(
                _run_process, args=(run, f'tcp://127.0.0.1:{_free_port()}', opts.threads), nprocs=experiment.gpus,
                join=False, start_method='spawn')
        stop.processes = [process.pid for process in context.processes]
        try:
            while not compat.join_processes(context, grace_period=LEAVE_GRACE_S):
                pass
        except torch.multiprocessing.ProcessExitedException as e:  # The process printed its reason.
            sys.exit(128 - e.exit_code if e.exit_code < 0 else e.exit_code or 1)  # Killed by signal N: 128 + N, as a shell says.


if __name__ == '__main__':
    main()
