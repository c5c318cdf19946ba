"""Seconds per discriminator step and per generator step of the --cfg presets, GN against the baselines.

    python -m bench.train_speed --batch=16                              # cifar10-resnet, batch 16: minutes on a CPU
    python -m bench.train_speed --cfg=cifar10-resnet --batch=64 --norms=gn,none --precisions=fp32,bf16 --out=speed.json
    python -m bench.train_speed --cfg=gn-stylegan --resolution=64 --cmax=64 --batch=8 --norms=gn,r1 --precisions=fp32,bf16 --rounds=3
    python -m bench.train_speed --cfg=cifar10-resnet --batch=16 --norms=gn --augs=noaug,ada,diffaug   # what augmentation costs

For every preset, discriminator constraint (--norms), fast-G setting (--fast-g; only meaningful for
the GN variants, and only where D is piecewise linear: for gn-stylegan and gn-stylegan2 the default, both,
times their exact G step alone), GN's D step in affine form or plain (--linear-d; GN only, see training/step/gradnorm.py),
one or separate D calls per D step (--fuse-d), what D sees (--augs: none, NVIDIA's ADA pipeline at its starting p,
whose transformations run whatever p is, or DiffAugment) and precision (--precisions), it builds G, D, the
optimizers and GANLoss with an Experiment (training/experiment.py), as train.py does, and times the
training loop's own D step and G step (NetworkUpdater.run of training/step/updater.py: zero_grad,
GANLoss.accumulate_gradients, gradient check, optimizer step through the loss scaler; shared with
the other bench scripts through bench/common.py), on random images and latents (the data pipeline
is not part of the measurement). gn-stylegan's networks are built for --resolution and run at
full resolution (lod 0), with --batch as the minibatch; the third example above (narrow, 64x64) takes
about 4 minutes on a 2-core CPU, bf16 included, while at full width (no --cmax: 512 maps) the same
command with the default norms runs past 15 minutes. Runs alternate between the
configurations of a preset, one D step and one G step of each per round, so that a change in the
machine's load hits all of them alike; every figure is the median over --rounds rounds after --warmup
untimed ones. A full iteration of a preset is n_dis D steps plus one G step.

Host work: after the timed rounds, one more D step and G step of every configuration are counted
(bench/common.count_host_work): ATen ops dispatched (forward and backward; on a GPU about one kernel
launch each), Python function calls, so that a change in host work shows on a CPU too, and on a GPU
the times the host waits for it (CUDA's synchronisation watch: 0 for a replayed step).

Memory (on a GPU): presets run one after another, and after a preset's timed rounds each of its
configurations runs alone, every other configuration's graphs freed, from its warm-ups to replays:
the peak memory allocated and held (graph pools included) of each row is its own.

Reported: sec/D step, sec/G step, sec/iteration, ops, Python calls and syncs per D and per G step, on
a GPU the peak memory held (GiB), and for each preset and precision the ratios GN /
vanilla (norm 'none') of the D step and of the G step, the figures of the GN-GAN paper's speed
table. --deterministic times the steps under train.py --deterministic's switches (what repeatable
GPU arithmetic costs); --device picks the device (default: the GPU when torch sees one). fp16 runs use
a GradScaler as the training loop does, and are never replayed as graphs. Prints a table; --out writes
the same numbers as JSON with the device, torch version, thread count, load average and date.

On a CPU shared with other work, wall time measures the neighbours as much as the code;
--clock=process --threads=1 times the CPU work of this process alone, which the neighbours perturb far
less.
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import datetime
import itertools
import os
import statistics
import time
from typing import Callable

import click

import torch

import dnnlib
from bench import authors
from bench.common import (HostWork, build_network, count_host_work, parse_list, preset_experiment,
                          random_batch, step_switches, training_step, write_json_atomic)
from torch_utils import devices, kernel_choice
from training.recipes import configs
from training.step import graphs, loss as loss_lib, precision as precision_lib

#----------------------------------------------------------------------------


def _blank(value: object) -> str:
    return '' if value is None else str(value)


def build_preset(cfg_name: str, norms: list[str], batch: int | None, resolution: int | None, cmax: int | None,
                 device: torch.device, ch: int | None = None, augs: tuple[str, ...] = ('noaug',)) -> dict:
    """The networks and optimizers of one preset (an Experiment (training/experiment.py)), shared by all of its configurations.

    Every norm except 'sn' uses the same D (sn builds D with spectral normalization), so one D
    (two with sn) and one G serve every configuration; their weights drift as the benchmark
    trains them, which changes nothing in the arithmetic being timed. `ch`: the SN-GAN and BigGAN networks' base width
    instead of the preset's. `augs`: the --aug settings timed (their GANLoss kwargs: `aug_loss_kwargs`).
    """
    opts = {norm: preset_experiment(cfg_name, norm=norm, resolution=resolution, batch=batch, cmax=cmax, aug='noaug')
            for norm in norms}
    aug_loss_kwargs = {aug: preset_experiment(cfg_name, resolution=resolution, batch=batch, cmax=cmax,
                                              aug=aug).loss_kwargs.get('augment_kwargs') for aug in augs}
    any_opts = next(iter(opts.values()))
    if ch is not None and configs.get_config(cfg_name).arch.startswith('stylegan'):
        raise click.ClickException(f'--ch: {cfg_name} is narrowed by --cmax')
    width = {} if ch is None else dict(ch=ch)
    G = build_network(dict(any_opts.G_kwargs, **width), device)
    G_opt = dnnlib.util.construct_class_by_name(params=G.parameters(), **any_opts.G_opt_kwargs)
    Ds, D_opts = {}, {}
    for norm in norms:
        sn = loss_lib.CONSTRAINTS[norm].spectral_norm
        if sn not in Ds:
            Ds[sn] = build_network(dict(opts[norm].D_kwargs, **width), device)
            D_opts[sn] = dnnlib.util.construct_class_by_name(params=Ds[sn].parameters(), **opts[norm].D_opt_kwargs)
    plan = any_opts.schedule.plan(0, 0)
    return dict(cfg=configs.get_config(cfg_name), opts=opts, aug_loss_kwargs=aug_loss_kwargs, G=G, G_opt=G_opt, Ds=Ds,
                D_opts=D_opts, n_dis=plan.n_dis,
                batch_D=plan.batch_D, batch_G=plan.batch_G, resolution=G.img_resolution,
                group_size=any_opts.schedule.group_size)


class Configuration:
    """One (preset, norm, fast_g, linear_d, fuse, aug, precision, CUDA graphs): the training loop's step for it, timed."""

    def __init__(self, preset: dict, norm: str, fast_g: bool | None, linear_d: bool | None, fuse: bool | None,
                 precision: str, device: torch.device, clock: Callable[[], float], deterministic: bool = False,
                 cuda_graphs: str = 'off', aug: str = 'noaug') -> None:
        self.preset, self.norm, self.precision, self.device, self.clock = preset, norm, precision, device, clock
        self.deterministic, self.cuda_graphs, self.aug = deterministic, cuda_graphs, aug
        sn = loss_lib.CONSTRAINTS[norm].spectral_norm
        loss_kwargs = dnnlib.EasyDict(preset['opts'][norm].loss_kwargs)
        if preset['aug_loss_kwargs'][aug] is not None:
            loss_kwargs.augment_kwargs = preset['aug_loss_kwargs'][aug]
        for key, value in [('fast_g', fast_g), ('fuse_d_calls', fuse), ('linear_d', linear_d)]:
            if value is not None:
                loss_kwargs[key] = value
        self.training = training_step(preset['G'], preset['Ds'][sn], preset['G_opt'], preset['D_opts'][sn], loss_kwargs,
                                      precision=precision, group_size=preset['group_size'], cuda_graphs=cuda_graphs)
        self.gn = loss_lib.CONSTRAINTS[norm].gn_zeta is not None
        # Per step: wall time from an idle GPU to its end; the host's part (until the call returns); the device's
        # part (CUDA events around the step queued behind a spin kernel, so they time the GPU's work alone).
        self.times: dict[str, dict[str, list[float]]] = {net: {'wall': [], 'host': [], 'device': []} for net in ('D', 'G')}
        self.host_work: dict[str, HostWork] = {}
        self.peak_memory = self.peak_reserved = 0  # Most bytes allocated / held by PyTorch (graph pools included) on the GPU
                                                   # during one of this configuration's timed steps.

    def batch(self, net: str) -> list[torch.Tensor]:
        p = self.preset
        real_img, real_c, _, gen_c = random_batch(p['G'], p['batch_D'] if net == 'D' else p['batch_G'], p['resolution'],
                                                  self.device)
        return [real_img, real_c, gen_c] if net == 'D' else [gen_c]

    def call(self, net: str, batch: list[torch.Tensor]) -> None:
        """One step of `net` on `batch`, as the training loop calls it."""
        if net == 'D':
            self.training.discriminator(*batch, rounds=1, step=0)
        else:
            self.training.generator(*batch, rounds=1, step=0)

    def step(self, net: str, record: bool) -> None:
        """One timed step (and on a GPU a second one, its device time), its switches set outside the timing (the
        training loop sets them once per run); with `record`, its times count."""
        batch = self.batch(net)
        with step_switches(self.training, self.deterministic):
            self._sync()
            start = self.clock()
            self.call(net, batch)
            host = self.clock() - start
            self._sync()
            wall = self.clock() - start
            if not record:
                return
            self.times[net]['wall'].append(wall)
            self.times[net]['host'].append(host)
            if self.device.type == 'cuda':
                self.times[net]['device'].append(self._device_time(net, batch, host))

    def _device_time(self, net: str, batch: list[torch.Tensor], host: float) -> float:
        """Seconds of GPU work in one step: queued behind a spin kernel long enough for the host to queue all of it."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        kernel_choice.hold_stream(self.device, 2e3 * host + 1)
        start.record()
        self.call(net, batch)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def replaying(self) -> bool:
        """Whether both steps replay CUDA graphs (after the warm-up)."""
        return all(self.training.captured[net].last_replayed for net in ('D', 'G'))

    def count_host_work(self) -> None:
        """Ops, Python calls and waits for the device of one D step and one G step (each run twice, see
        count_host_work), under switches set around them as the training loop sets them once per run."""
        for net in ('D', 'G'):
            batch = self.batch(net)
            with step_switches(self.training, self.deterministic):
                self.host_work[net] = count_host_work(lambda: self.call(net, batch), self.device)

    def measure_memory(self, others: list[Configuration]) -> None:
        """On a GPU, the most memory this configuration's steps allocate and hold (graph pools included): with every
        configuration's graphs freed first, from its warm-ups through its capture to replays; its graphs freed after,
        so that the next configuration's figures are its own."""
        if self.device.type != 'cuda':
            return
        for run in others:
            run.training.release_graphs()
        self._sync()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        with step_switches(self.training, self.deterministic):
            for _ in range(graphs.WARMUP_STEPS + 4):  # Warm-ups, the capture's call, the checked replay, replays.
                for net in ('D', 'G'):
                    self.call(net, self.batch(net))
        self._sync()
        self.peak_memory = torch.cuda.max_memory_allocated(self.device)
        self.peak_reserved = torch.cuda.max_memory_reserved(self.device)
        self.training.release_graphs()

    def _sync(self) -> None:
        if self.device.type == 'cuda':
            torch.cuda.synchronize(self.device)

    def result(self) -> dict:
        median = lambda net, part: statistics.median(self.times[net][part]) if self.times[net][part] else None
        d, g = median('D', 'wall'), median('G', 'wall')
        loss = self.training.loss
        row = dict(cfg=self.preset['cfg'].name, norm=self.norm, fast_g=loss.fast_g if self.gn else None,
                   linear_d=loss.bias_layers is not None if self.gn else None, fuse_d_calls=loss.fuse_d_calls,
                   aug=self.aug, precision=self.precision, cuda_graphs=self.cuda_graphs, replayed=self.replaying(),
                   batch_D=self.preset['batch_D'], batch_G=self.preset['batch_G'],
                   resolution=self.preset['resolution'], n_dis=self.preset['n_dis'], sec_per_D_step=d, sec_per_G_step=g,
                   sec_per_iteration=self.preset['n_dis'] * d + g, rounds=len(self.times['D']['wall']))
        for net in ('D', 'G'):
            host, device = median(net, 'host'), median(net, 'device')
            row.update({f'host_sec_per_{net}_step': host, f'device_sec_per_{net}_step': device,
                        f'{net}_bound_by': None if device is None else 'host' if host > device else 'device'})
        row.update(ops_per_D_step=self.host_work['D'].ops, python_calls_per_D_step=self.host_work['D'].python_calls,
                   ops_per_G_step=self.host_work['G'].ops, python_calls_per_G_step=self.host_work['G'].python_calls,
                   syncs_per_D_step=self.host_work['D'].syncs, syncs_per_G_step=self.host_work['G'].syncs,
                   deterministic=self.deterministic,
                   peak_memory_gib=self.peak_memory / 2 ** 30 if self.device.type == 'cuda' else None,
                   peak_reserved_gib=self.peak_reserved / 2 ** 30 if self.device.type == 'cuda' else None)
        return row

#----------------------------------------------------------------------------


def ratios(rows: list[dict]) -> list[dict]:
    """GN / vanilla per preset, precision, fast-G, affine-D and fused-D setting: D step, G step and full iteration."""
    out = []
    for row in rows:
        if row['norm'] != 'gn':
            continue
        base = next((r for r in rows if r['norm'] == 'none' and r['cfg'] == row['cfg'] and r['precision'] == row['precision']
                     and r['fuse_d_calls'] == row['fuse_d_calls'] and r['cuda_graphs'] == row['cuda_graphs']
                     and r['aug'] == row['aug']), None)
        if base is not None:
            out.append(dict(cfg=row['cfg'], precision=row['precision'], fast_g=row['fast_g'], linear_d=row['linear_d'],
                            fuse_d_calls=row['fuse_d_calls'], cuda_graphs=row['cuda_graphs'], aug=row['aug'],
                            D=row['sec_per_D_step'] / base['sec_per_D_step'],
                            G=row['sec_per_G_step'] / base['sec_per_G_step'],
                            iteration=row['sec_per_iteration'] / base['sec_per_iteration']))
    return out


def augmentation_costs(rows: list[dict]) -> list[dict]:
    """Each augmented row over the same configuration without augmentation: D step, G step and full iteration."""
    same = ('cfg', 'norm', 'fast_g', 'linear_d', 'fuse_d_calls', 'precision', 'cuda_graphs')
    out = []
    for row in rows:
        base = next((r for r in rows if r['aug'] == 'noaug' and all(r[k] == row[k] for k in same)), None)
        if row['aug'] != 'noaug' and base is not None:
            out.append(dict({k: row[k] for k in same}, aug=row['aug'], D=row['sec_per_D_step'] / base['sec_per_D_step'],
                            G=row['sec_per_G_step'] / base['sec_per_G_step'],
                            iteration=row['sec_per_iteration'] / base['sec_per_iteration']))
    return out


def graph_speedups(rows: list[dict]) -> list[dict]:
    """Eager / graph time of the D step, the G step and the iteration, for each configuration run both ways."""
    out = []
    same = lambda a, b: all(a[k] == b[k] for k in ('cfg', 'norm', 'fast_g', 'linear_d', 'fuse_d_calls', 'precision'))
    for row in rows:
        eager = next((r for r in rows if r['cuda_graphs'] == 'off' and same(r, row)), None) if row['cuda_graphs'] == 'on' else None
        if eager is not None:
            out.append(dict(cfg=row['cfg'], norm=row['norm'], precision=row['precision'], replayed=row['replayed'],
                            D=eager['sec_per_D_step'] / row['sec_per_D_step'], G=eager['sec_per_G_step'] / row['sec_per_G_step'],
                            iteration=eager['sec_per_iteration'] / row['sec_per_iteration']))
    return out


def print_ratios(title: str, rows: list[dict], label: Callable[[dict], str]) -> None:
    """A table of D step, G step and iteration ratios, one labelled line per row."""
    if rows:
        print(f'\n{title}:')
        for r in rows:
            print(f'{label(r)} D {r["D"]:.2f}  G {r["G"]:.2f}  iteration {r["iteration"]:.2f}')


SETTINGS = {'both': [True, False], 'on': [True], 'off': [False], 'default': [None]}  # An on/off option's variants.


def fast_variants(cfg_name: str, D: torch.nn.Module, fast_g: str) -> list[bool | None]:
    """The fast-G variants of --fast-g for a GN D: the fast first-order G step is exact only for a piecewise-linear D
    (training/step/gradnorm.py), so where D is not (gn-stylegan, gn-stylegan2, a smooth --act) `both` runs the exact
    step alone, with a note, and `on` is refused in one line."""
    if getattr(D, 'is_piecewise_linear', False) or fast_g in ('off', 'default'):
        return SETTINGS[fast_g]
    if fast_g == 'on':
        raise click.ClickException(f'--fast-g=on: {cfg_name}\'s D is not piecewise linear, so it has no fast G step; '
                                   f'use --fast-g=default (its exact G step) or both')
    print(f'{cfg_name}: --fast-g=both times the exact G step alone: its D is not piecewise linear (no fast G step)')
    return [False]


@click.command(epilog='Example, the digits\' GN-StyleGAN step on a CPU:\n\n\b\n'
               '  python -m bench.train_speed --cfg=gn-stylegan --resolution=32 --cmax=16 --batch=8 --norms=gn,none\n\n'
               'gn-stylegan and gn-stylegan2 need --resolution (they have none of their own); gn-stylegan also --batch '
               '(gn-stylegan2 takes its 32). --cmax narrows them to a CPU\'s size. The other presets fix their '
               'resolution and batch.')
@click.option('--cfg', 'cfg_names',     help='Presets, comma-separated', default='cifar10-resnet', show_default=True,
              callback=parse_list(tuple(configs.PRESETS)))
@click.option('--norms',                help='Discriminator constraints, comma-separated', default='gn,none,sn,gp1', show_default=True,
              callback=parse_list(loss_lib.NORMS))
@click.option('--fast-g', 'fast_g',     help='Fast GN generator step: on, off, both, or GANLoss\'s default (on where D is '
              'piecewise linear); GN norms only, and where D is not piecewise linear both is the exact step alone',
              type=click.Choice(['both', 'on', 'off', 'default']), default='both', show_default=True)
@click.option('--linear-d', 'linear_d', help='GN D step with f in affine form: on, off, both, or GANLoss\'s default (on '
              'where D qualifies)', type=click.Choice(['default', 'both', 'on', 'off']), default='default', show_default=True)
@click.option('--fuse-d', 'fuse_d',     help='One D call on reals + fakes: on, off, both, or GANLoss\'s default for the device',
              type=click.Choice(['default', 'both', 'on', 'off']), default='default', show_default=True)
@click.option('--augs',                 help='What D sees, comma-separated: noaug, ada (NVIDIA\'s bgc pipeline at its starting '
                                             'p), diffaug (color,translation,cutout)', default='noaug', show_default=True,
              callback=parse_list(('noaug', 'ada', 'diffaug')))
@click.option('--precisions',           help='Precisions, comma-separated', default='fp32', show_default=True,
              callback=parse_list(precision_lib.PRECISIONS))
@click.option('--batch',                help='D batch M (G gets the preset\'s ratio)  [default: the preset\'s]; gn-stylegan(2): the minibatch', type=click.IntRange(min=2))
@click.option('--resolution',           help='gn-stylegan, gn-stylegan2: resolution of the networks (gn-stylegan: at lod 0)', type=click.IntRange(min=8))
@click.option('--cmax',                 help='gn-stylegan, gn-stylegan2: maximum feature maps per layer', type=click.IntRange(min=1))
@click.option('--ch',                   help='SN-GAN and BigGAN presets: the networks\' base width instead of the preset\'s (a '
              'quick look on a CPU)', type=click.IntRange(min=1))
@click.option('--rounds',               help='Timed rounds (one D and one G step of every configuration each)', type=click.IntRange(min=1),
              default=5, show_default=True)
@click.option('--warmup',               help='Untimed rounds first', type=click.IntRange(min=0), default=1, show_default=True)
@click.option('--threads',              help='torch intra-op threads  [default: torch\'s]', type=click.IntRange(min=1))
@click.option('--clock',                help='wall: elapsed time; process: CPU time of this process (a CPU run on a shared machine, '
              'with --threads=1)', type=click.Choice(['wall', 'process']), default='wall', show_default=True)
@click.option('--device',               help='cpu, cuda or cuda:N  [default: cuda if torch sees a GPU, else cpu]', metavar='DEVICE')
@click.option('--deterministic',        help='Repeatable GPU arithmetic, as train.py --deterministic (what it costs)', is_flag=True)
@click.option('--cuda-graphs', 'cuda_graphs', help='Steps replayed as CUDA graphs: auto (as train.py), on, off, or both (on and off '
              'side by side)', type=click.Choice(['auto', 'on', 'off', 'both']), default='auto', show_default=True)
@click.option('--authors-code', 'authors_code', help='A checkout of the GN-GAN authors\' code (basiclab/GNGAN-PyTorch): their '
              'steps of the same presets, norms gn/none and precisions fp32/tf32, timed in the same rounds (bench/authors.py)',
              metavar='DIR', type=click.Path(exists=True, file_okay=False))
@click.option('--out',                  help='JSON file for the results', metavar='PATH')
def main(cfg_names: list[str], norms: list[str], fast_g: str, linear_d: str, fuse_d: str, augs: list[str],
         precisions: list[str], batch: int | None,
         resolution: int | None, cmax: int | None, ch: int | None, rounds: int, warmup: int, threads: int | None, clock: str,
         device: str | None, deterministic: bool, cuda_graphs: str, authors_code: str | None, out: str | None) -> None:
    """Seconds per D step and per G step of the presets, for each norm, fast-G setting, augmentation, precision and CUDA-graph
    setting."""
    try:
        device = devices.parse_device(device)
    except ValueError as e:
        raise click.ClickException(f'--device: {e}')
    if cuda_graphs in ('on', 'both') and device.type != 'cuda':
        raise click.ClickException(f'--cuda-graphs={cuda_graphs} needs a CUDA device')
    graph_settings = ['on', 'off'] if cuda_graphs == 'both' else [cuda_graphs]
    if device.type == 'cuda' and cuda_graphs != 'off':
        warmup = max(warmup, graphs.WARMUP_STEPS + 2)  # The graph's eager warm-up steps, its capture, its checked replay.
    if threads is not None:
        torch.set_num_threads(threads)
    if clock == 'process' and device.type == 'cuda':
        raise click.ClickException('--clock=process measures CPU time, which says nothing about GPU work; use --clock=wall')
    clock_fn = time.perf_counter if clock == 'wall' else time.process_time
    linear_settings, fuse_settings = SETTINGS[linear_d], SETTINGS[fuse_d]

    rows, authors_rows = [], []
    gradnorm_losses = authors.import_authors_code(authors_code) if authors_code is not None else None
    for name in cfg_names:  # One preset at a time: its networks, graphs and memory are its own.
        preset = build_preset(name, norms, batch, resolution, cmax, device, ch, tuple(augs))
        runs = []
        for norm in norms:
            gn = loss_lib.CONSTRAINTS[norm].gn_zeta is not None
            for fast in (fast_variants(name, preset['Ds'][loss_lib.CONSTRAINTS[norm].spectral_norm], fast_g) if gn
                         else [None]):
                for linear in (linear_settings if gn else [None]):
                    for fuse, aug, precision, graph_setting in itertools.product(fuse_settings, augs, precisions,
                                                                                  graph_settings):
                        if graph_setting == 'on' and precision == 'fp16':
                            continue  # fp16's loss scaling reads the GPU every step: never captured.
                        runs.append(Configuration(preset, norm, fast, linear, fuse, precision, device, clock_fn,
                                                  deterministic, graph_setting, aug))
        theirs = []
        if gradnorm_losses is not None:
            for run in runs:
                key = (run.preset['cfg'].name, run.norm, run.precision if run.precision in authors.PRECISIONS else 'tf32')
                if key[0] in authors.ARCHITECTURES and key[1] in authors.NORMS and key not in [(t.cfg, t.norm, t.precision) for t in theirs]:
                    theirs.append(authors.AuthorsConfiguration(*key, run.preset['batch_D'], run.preset['batch_G'], run.preset['n_dis'],
                                                               device, clock_fn, *gradnorm_losses))
        for round_idx in range(warmup + rounds):
            for run in runs + theirs:
                for net in ('D', 'G'):
                    run.step(net, record=round_idx >= warmup)
        for run in runs:
            run.count_host_work()
        for run in runs:
            run.measure_memory(runs)
        rows += [run.result() for run in runs]
        authors_rows += [run.result() for run in theirs]
        del preset, runs, theirs
        if device.type == 'cuda':
            torch.cuda.empty_cache()

    on_off = lambda flag: '' if flag is None else ('on' if flag else 'off')
    seconds = lambda value: '' if value is None else f'{value:.4f}'
    print(f'{"cfg":<20} {"norm":<5} {"fast_g":<6} {"lin_d":<6} {"fuse_d":<6} {"aug":<7} {"prec":<5} {"graph":<5} {"batch":>7} {"s/D step":>9} '
          f'{"s/G step":>9} {"s/iter":>8} {"host/D":>7} {"dev/D":>7} {"host/G":>7} {"dev/G":>7} {"ops/D":>6} {"calls/D":>7} '
          f'{"ops/G":>6} {"calls/G":>7} {"sync/D":>6} {"sync/G":>6} {"GiB":>6}')
    for r in rows:
        print(f'{r["cfg"]:<20} {r["norm"]:<5} {on_off(r["fast_g"]):<6} {on_off(r["linear_d"]):<6} {on_off(r["fuse_d_calls"]):<6} '
              f'{r["aug"]:<7} {r["precision"]:<5} '
              f'{on_off(r["replayed"]):<5} {r["batch_D"]:>3}/{r["batch_G"]:<3} '
              f'{r["sec_per_D_step"]:>9.4f} {r["sec_per_G_step"]:>9.4f} {r["sec_per_iteration"]:>8.3f} '
              f'{seconds(r["host_sec_per_D_step"]):>7} {seconds(r["device_sec_per_D_step"]):>7} '
              f'{seconds(r["host_sec_per_G_step"]):>7} {seconds(r["device_sec_per_G_step"]):>7} '
              f'{r["ops_per_D_step"]:>6} {r["python_calls_per_D_step"]:>7} {r["ops_per_G_step"]:>6} {r["python_calls_per_G_step"]:>7} '
              f'{_blank(r["syncs_per_D_step"]):>6} {_blank(r["syncs_per_G_step"]):>6} '
              f'{"" if r["peak_reserved_gib"] is None else format(r["peak_reserved_gib"], ".2f"):>6}')
    for r in authors_rows:
        print(f'{r["cfg"]:<20} {r["norm"]:<5} {"(authors)":<20} {"noaug":<7} {r["precision"]:<5} {"":<5} {r["batch_D"]:>3}/{r["batch_G"]:<3} '
              f'{r["sec_per_D_step"]:>9.4f} {r["sec_per_G_step"]:>9.4f} {r["sec_per_iteration"]:>8.3f}')
    gn_ratios, versus_authors, speedups = ratios(rows), authors.ours_over_authors(rows, authors_rows), graph_speedups(rows)
    print_ratios('GN / vanilla (norm none)', gn_ratios, lambda r: f'{r["cfg"]:<20} {r["precision"]:<5} graph {r["cuda_graphs"]:<4} '
                 f'fast_g {on_off(r["fast_g"]):<4} lin_d {on_off(r["linear_d"]):<4} fuse_d {on_off(r["fuse_d_calls"]):<4}')
    print_ratios('Ours / the authors\' code', versus_authors, lambda r: f'{r["cfg"]:<20} {r["norm"]:<5} {r["precision"]:<5} '
                 f'(theirs at {r["against"]}) graphs {r["cuda_graphs"]:<4} replayed {on_off(r["replayed"]):<4}')
    aug_costs = augmentation_costs(rows)
    print_ratios('Augmented / noaug', aug_costs, lambda r: f'{r["cfg"]:<20} {r["norm"]:<5} {r["aug"]:<7} {r["precision"]:<5} '
                 f'graph {r["cuda_graphs"]:<4}')
    print_ratios('Eager / CUDA graph', speedups,
                 lambda r: f'{r["cfg"]:<20} {r["norm"]:<5} {r["precision"]:<5} replayed {on_off(r["replayed"]):<4}')

    if out is not None:
        write_json_atomic(out, dict(
            benchmark='training step of the presets (GANLoss.accumulate_gradients + Adam), medians',
            device=torch.cuda.get_device_name(device) if device.type == 'cuda' else f'CPU ({os.cpu_count()} cores)',
            threads=torch.get_num_threads(),
            clock=clock,
            load_average=os.getloadavg(),
            torch=torch.__version__,
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
            rounds=rounds, warmup=warmup, results=rows, gn_over_vanilla=gn_ratios, eager_over_graph=speedups,
            augmented_over_noaug=aug_costs,
            authors=authors_rows, ours_over_authors=versus_authors))
        print(f'Results written to {out}')


if __name__ == '__main__':
    main()  # pylint: disable=no-value-for-parameter
