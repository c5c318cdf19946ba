"""Launching a run's processes: train.py's own process, the --gpus=N processes it spawns, or torchrun's workers.

    `place`         under torchrun (RANK and WORLD_SIZE set) this process is one worker of WORLD_SIZE and --gpus
                    is ignored; the device, and whether this machine has a GPU for each of its processes, are
                    checked before anything starts;
    `open_run_dir`  a new run directory with training_options.json, or the one --resume=latest continues without
                    the records of what it redoes (and with the options a resume changed); under torchrun, process 0
                    names it and tells the others;
    `launch`        one process per GPU, each training the run (`run_process`). A signal that train.py receives
                    goes on to the processes it spawned; a second one kills them; when one process ends, the
                    others have LEAVE_GRACE_S to end by themselves.

A process that fails ends with one line on stderr and exit status 1, or EXIT_STOPPED when a signal stopped
it; with --gpus=N, train.py ends with the status of the first process that failed (128 + N for one killed by
signal N, as a shell says).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import multiprocessing
import os
import shlex
import signal
import socket
import sys

import torch

import dnnlib
from torch_utils import compat, devices
from torch_utils.threads import set_threads
from training.intake import Start, StartRefused, load_resume, without_resume
from training.run import run_dirs, write_failure
from training.run.stop_signal import EXIT_STOPPED, RunStopped, StopSignal
from training.step import CudaGraphsBroken

LEAVE_GRACE_S = 10  # --gpus=N: how long the others may take to end after one process ended (before SIGTERM, SIGKILL).

#----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Placement:
    device: torch.device    # The experiment's device (--device, or CUDA when visible).
    gpus: int               # Processes of the run: --gpus, or torchrun's WORLD_SIZE.
    rank: int               # This process's rank among them (0 unless a torchrun worker).
    torchrun: bool          # This process is a worker that torchrun started.


def place(gpus: int, device: str | None) -> Placement:
    """Where the run's processes are, for --gpus=`gpus` and --device=`device`; StartRefused for a device that is not
    one, or when this machine lacks the GPUs the processes need."""
    torchrun = 'RANK' in os.environ and 'WORLD_SIZE' in os.environ
    if torchrun:
        gpus = int(os.environ['WORLD_SIZE'])
    try:
        parsed = devices.parse_device(device)
    except ValueError as e:
        raise StartRefused(f'--device: {e}')
    try:
        devices.check_process_count(parsed, int(os.environ.get('LOCAL_WORLD_SIZE', gpus)))
    except ValueError as e:
        raise StartRefused(str(e))
    return Placement(device=parsed, gpus=gpus, rank=int(os.environ['RANK']) if torchrun else 0, torchrun=torchrun)


def open_run_dir(start: Start, outdir: str, where: Placement, stop: StopSignal) -> dnnlib.EasyDict:
    """The run that the processes train (for `run_process`): a new run directory in `outdir` with training_options.json,
    or the one that `start` continues, without the records after its snapshot (they are redone). Prints where, and
    what the run starts from."""
    try:
        run_dirs.check_outdir(outdir)
    except ValueError as e:
        raise StartRefused(str(e))
    desc, options = start.experiment.description, start.record()  # The options as printed, before any choice of process 0.
    run_dir = start.continuation.run_dir if start.continuation is not None else None
    if where.torchrun:  # Rank 0 names the run directory and tells the other workers.
        chosen = [run_dir or (run_dirs.next_run_dir(outdir, desc) if where.rank == 0 else None), start.resume_pkl]
        if where.gpus > 1:
            _init_process_group('env://', rank=where.rank, world_size=where.gpus,
                                device=devices.process_device(where.device, _local_rank(where.rank)))
            torch.distributed.broadcast_object_list(chosen, src=0)
        if chosen[1] != start.resume_pkl and start.initial is None:  # This node saw --outdir otherwise (a shared file system's delay): rank 0 decides.
            start = dataclasses.replace(start, resume=None if chosen[1] is None else load_resume(chosen[1]))
        run_dir, start = chosen[0], dataclasses.replace(start, resume_pkl=chosen[1])
    elif run_dir is None:
        run_dir = run_dirs.next_run_dir(outdir, desc)
    continue_args = [f'python {sys.argv[0]}' if not where.torchrun else f'(the same launcher) {sys.argv[0]}',
                     *without_resume(sys.argv[1:])]
    if where.rank == 0 and start.continuation is None:
        print(f'Output directory: {run_dir}')
        try:
            run_dirs.create(run_dir, options)
        except dnnlib.util.WriteError as e:
            raise StartRefused(write_failure.explain(e, None, continue_args)) from None
    elif where.rank == 0:
        print(f'Output directory: {run_dir} (continued)')
        progress = start.resume['progress']
        try:
            dropped = run_dirs.drop_records_after(run_dir, progress['step'], progress['cur_nimg'])
            if start.resume_changes:  # The run's record says what it is now, and since which G step (`resumes`).
                run_dirs.write_options(run_dir, options)
        except dnnlib.util.WriteError as e:
            raise StartRefused(write_failure.explain(e, run_dir, continue_args)) from None
        if dropped:
            print(f'Dropped {dropped} record(s) of stats.jsonl and metric-*.jsonl from after the snapshot: they are redone')
    return dnnlib.EasyDict(experiment=start.experiment, run_dir=run_dir, resume=start.resume, initial=start.initial,
                           origin=start.origin(),
                           resume_pkl=start.resume_pkl, resume_pkl_given=start.resume_given, continue_args=continue_args,
                           stop_shared=stop.shared)


def launch(run: dnnlib.EasyDict, where: Placement, num_threads: int | None, stop: StopSignal) -> None:
    """Train `run` in one process per GPU: this one (one GPU, or a torchrun worker) or as many spawned ones, with
    `num_threads` CPU threads each (None: the default of run_process)."""
    if where.torchrun:
        if torch.distributed.is_initialized():
            torch.distributed.barrier()  # The run directory exists before any worker writes to it.
        run_process(where.rank, run, init_method=None, num_threads=num_threads, stop=stop)
    elif run.experiment.gpus == 1:
        run_process(0, run, init_method=None, num_threads=num_threads, stop=stop)
    else:  # A stop request goes on to the processes (run.stop_shared); a second signal kills them.
        with stop.blocked():
            context = torch.multiprocessing.start_processes(
                run_process, args=(run, f'tcp://127.0.0.1:{_free_port()}', num_threads), nprocs=run.experiment.gpus,
                join=False, start_method='spawn')
        stop.processes = [process.pid for process in context.processes]
        try:
            while not compat.join_processes(context, grace_period=LEAVE_GRACE_S):
                pass
        except torch.multiprocessing.ProcessExitedException as e:  # The process printed its reason.
            sys.exit(128 - e.exit_code if e.exit_code < 0 else e.exit_code or 1)  # Killed by signal N: 128 + N, as a shell says.


def run_process(rank: int, run: dnnlib.EasyDict, init_method: str | None, num_threads: int | None,
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
    """The body of run_process."""
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
    if rank == 0:
        for line in run.origin:  # What the run starts from and what a resume changes: on the console and in log.txt.
            print(line)
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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _local_rank(rank: int) -> int:
    """This process's index among the processes of its machine (torchrun says; --gpus=N spawns them all here)."""
    return int(os.environ.get('LOCAL_RANK', rank))


def _init_process_group(init_method: str, rank: int, world_size: int, device: torch.device) -> None:
    torch.distributed.init_process_group(devices.process_group_backend(device), init_method=init_method, rank=rank,
                                         world_size=world_size)

#----------------------------------------------------------------------------
