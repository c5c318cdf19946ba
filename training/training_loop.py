"""The training loop: the paper's alternating D/G updates, with progress, snapshots and metrics.

One iteration is one generator update ("G step", the unit the paper counts in). The run's schedule
(training/recipes/schedule.py) says, before every G step, what it uses:

    set up, or resume from a snapshot (networks, optimizers, counters, data position, random streams)
    for each G step, until the schedule says done:
        plan <- schedule(step, images shown)     # batches, accumulation rounds, lr, EMA beta, lod
        if the plan's optimizer state id changed: reset Adam   # StyleGAN v1: every new level of detail
        repeat n_dis times:                       # discriminator updates
            x ~ data (M), at the lod, flipped at random (xflip); z ~ N(0, I) (M)
            minimize L_D(f_hat(x), f_hat(G(z)))   # f_hat = GN-normalized D, see training/step/gradnorm.py
        z ~ N(0, I) (M_G)
        minimize L_G(f_hat(G(z)))
        G_ema <- beta * G_ema + (1 - beta) * G
        every tick: stop if a gradient diverged, report progress; every few ticks: image grid,
            metrics, snapshot
        on SIGTERM / SIGUSR1: a snapshot after the G step in progress, and stop (RunStopped)

Each "minimize" is one Adam step on the gradient of the batch mean. The batch is global: every
process (one per GPU, or gloo on a CPU) takes its share of disjoint data, in accumulation rounds
when the share exceeds --batch-gpu, and the processes average their gradients before the step.

The run is described by an Experiment (training/experiment.py), from which the loop builds
networks, optimizers, loss and schedule. The parts, one concept each: the real-image stream and
fake labels (training/data/data_stream.py), the D and G steps (training/step/training_step.py: one
network's update each, replayed as CUDA graphs on a GPU), the run state and its snapshots (training/run/run_state.py), progress
lines, statistics, grids and the divergence stop (training/run/reporter.py), metrics at snapshots
(training/run/evaluation.py), the stop on a signal (training/run/stop_signal.py), out of GPU memory in
one line (training/run/out_of_memory.py), a file that cannot be written (a full disk) in one line, after the
snapshot that can be (training/run/write_failure.py), and the arithmetic (training/step/precision.py).
"""

from __future__ import annotations

import contextlib
import copy
import os
import time

import torch

import dnnlib
from torch_utils import devices, misc
from training.data.data_stream import LabelSampler, RealImageStream
from training.experiment import Experiment
from training.run.evaluation import MetricEvaluator
from training.run.out_of_memory import explain_out_of_memory
from training.run.reporter import ImageGrids, TickReporter
from training.run.run_state import RunState, snapshot_label
from training.run.stop_signal import RunStopped, StopSignal
from training.run.write_failure import Deferred
from training.step import TrainingStep

#----------------------------------------------------------------------------


def training_loop(
    experiment: Experiment,     # The run: data, networks, loss, schedule, precision, seed, reporting (training/experiment.py).
    run_dir: str = '.',         # Output directory.
    device: str = 'cpu',        # Where this process computes: 'cpu' or 'cuda:N' (torch_utils/devices.py).
    rank: int = 0,              # This process, of experiment.gpus.
    resume: dict | None = None, # Snapshot to continue from, as persistence.load_snapshot returns it.
    initial: dict | None = None, # Networks to start from by name, weights only (train.py --resume of NVIDIA's pickle).
    stop: StopSignal | None = None, # The stop request of SIGTERM / SIGUSR1 (None: one for this run alone).
) -> None:
    """Train G and D as `experiment` says, by the algorithm in the module docstring; write everything into `run_dir`."""
    # Set up: arithmetic, random streams, data, networks, loss, schedule, optimizers. The process-wide switches
    # (TF32, cuDNN, determinism) and the stop signal's handlers hold for the run and are restored when it ends,
    # however it ends, and its progress files are closed; out of GPU memory ends it with one line.
    start_time = time.time()
    device = torch.device(device)
    num_gpus, seed, precision, schedule = experiment.gpus, experiment.seed, experiment.arithmetic, experiment.schedule
    state = RunState(seed, num_gpus, rank, device, experiment.best_metric)  # Seeds every stream.
    stop = StopSignal() if stop is None else stop
    with devices.run_switches(device, precision.allow_tf32, experiment.deterministic), stop, explain_out_of_memory(experiment, state), \
            contextlib.ExitStack() as closing:
        log = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)
        training_set_kwargs = experiment.training_set_kwargs
        training_set = dnnlib.util.construct_class_by_name(**training_set_kwargs)
        log(f'Dataset: {len(training_set)} images, {training_set.resolution}x{training_set.resolution}, '
            f'{training_set.num_channels} channel(s), labels: {training_set.label_dim or "none"}')
        G = dnnlib.util.construct_class_by_name(**experiment.G_kwargs).train().requires_grad_(False).to(device)
        D = dnnlib.util.construct_class_by_name(**experiment.D_kwargs).train().requires_grad_(False).to(device)
        G_ema = copy.deepcopy(G).eval()
        precision.lay_out(G, D)  # The weights' memory format (channels-last on a CPU), not their values.
        G_opt = dnnlib.util.construct_class_by_name(params=G.parameters(), **experiment.G_opt_kwargs)
        D_opt = dnnlib.util.construct_class_by_name(params=D.parameters(), **experiment.D_opt_kwargs)
        loss = dnnlib.util.construct_class_by_name(**experiment.loss_kwargs, G=G, D=D, precision=precision)
        log(f'G: {sum(p.numel() for p in G.parameters()):,} parameters, D: {sum(p.numel() for p in D.parameters()):,}')
        if loss.exact_path_note() is not None:
            log(loss.exact_path_note())
        nets, optimizers = dict(G=G, D=D, G_ema=G_ema), dict(G_opt=G_opt, D_opt=D_opt)

        # Resume, then the same networks in every process.
        if resume is not None:
            state.resume(resume, nets, optimizers, loss, log)
            log(f'Resumed at G step {state.step}, {state.cur_nimg / 1000:g} kimg')
        for name, net in (initial or {}).items():
            misc.copy_params_and_buffers(net, nets[name], require_all=True)
        for module in nets.values():
            misc.broadcast_module(module)

        # The parts: steps, data, outputs.
        steps = TrainingStep(G, D, G_opt, D_opt, loss, G_ema=G_ema, group_size=schedule.group_size,
                             cuda_graphs=experiment.cuda_graphs, num_gpus=num_gpus, log=log)
        reals = RealImageStream(training_set, chunk=schedule.min_share(), rank=rank, num_replicas=num_gpus, seed=seed,
                                device=device, num_workers=experiment.workers, consumed=state.resume_position, xflip=experiment.xflip,
                                max_resolution=G.img_resolution)
        fake_labels = LabelSampler(training_set, state.label_rng, device)
        reporter = closing.enter_context(TickReporter(run_dir, schedule, state, experiment.tick, start_time, device, log))
        deferred = Deferred()  # A grid or metric record that cannot be written waits for the snapshot (write_failure.py).
        evaluator = MetricEvaluator(list(experiment.metrics), experiment.metric_kwargs, training_set_kwargs, run_dir, num_gpus,
                                    rank, device, log, stop, deferred)
        grids = ImageGrids(run_dir, training_set, G.z_dim, seed, device) if rank == 0 else None
        if grids is not None and resume is None:
            grids.save(G_ema, '_init')
        snapshot = lambda: state.snapshot(nets, optimizers, loss, reals.consumed, training_set_kwargs, experiment.record())
        snapshot_path = lambda label: os.path.join(run_dir, f'network-snapshot-{label}.pkl')
        last_grid = None
        log(f'Training: {schedule.describe()[0]}')

        while not schedule.done(state.step, state.cur_nimg):
            # Stop signal, seen by every process at this G step boundary: a snapshot (unless this step has one), and out.
            if stop.agreed():
                if state.saved_step != state.step:
                    state.save([snapshot_path(snapshot_label(state.cur_nimg))], snapshot())
                raise RunStopped(stop.signal_name, state.step, state.last_snapshot)

            # Plan of this G step: learning rates, Adam resets, level of detail.
            plan = schedule.plan(state.step, state.cur_nimg)
            steps.set_plan(plan)

            # Discriminator steps: reals and fakes G(z, c), z drawn in the step.
            for _ in range(plan.n_dis):
                real_img, real_c = reals.next(plan.share_D, plan.lod)
                steps.discriminator(real_img, real_c, fake_labels.sample(plan.share_D), plan.rounds_D, state.step)
                state.cur_nimg += plan.batch_D

            # Generator step, then its moving average.
            steps.generator(fake_labels.sample(plan.share_G), plan.rounds_G, state.step, plan.ema_beta)
            state.step += 1

            # Tick: divergence stop and progress line; image grid, metrics and snapshot when due.
            done = schedule.done(state.step, state.cur_nimg)
            if not done and not reporter.tick_due(state):
                continue
            stats = reporter.tick([steps.updaters['D'], steps.updaters['G']], state, done,
                                  augment_p=None if loss.augment is None else loss.augment.p)
            state.cur_tick += 1
            label = snapshot_label(state.cur_nimg)
            snapshot_due = done or (experiment.snap is not None and state.cur_tick % experiment.snap == 0)
            if grids is not None and snapshot_due:
                with deferred.guard():
                    last_grid = grids.save(G_ema, label)
            if snapshot_due:
                for module in nets.values():
                    misc.check_ddp_consistency(module)  # Every process must hold the same networks.
                snapshot_pkl = snapshot_path(label)
                metric_stats, results = evaluator.evaluate(G_ema, snapshot_pkl, D=D)  # Before the snapshot, which records them.
                stats.update(metric_stats)
                new_best = state.record_metric(results)
                state.save([snapshot_pkl] + ([os.path.join(run_dir, 'network-best.pkl')] if new_best else []), snapshot())
                if new_best:
                    log(f'New best {experiment.best_metric}: {state.best:.4g} -> network-best.pkl')
            reporter.end_tick(stats, state, chart=snapshot_due)
            deferred.raise_error()

    # Done: say where the results are.
    log('Exiting...')
    if state.last_snapshot is not None:
        log(f'Final snapshot: {state.last_snapshot}')
        pick_class = ' --class=0' if G.c_dim else ''  # Conditional: any class in 0..c_dim-1.
        log(f'Generate images: python generate.py --network={state.last_snapshot} --seeds=0-63 --grid{pick_class} --outdir=out')
    if last_grid is not None:
        log(f'Image grids: {os.path.join(run_dir, "fakes*.png")} (latest: {os.path.basename(last_grid)})')
