"""Seconds per discriminator step and per generator step of the --cfg presets, GN against the baselines.

    python bench/train_speed.py --batch=16                              # cifar10-resnet, batch 16: minutes on a CPU
    python bench/train_speed.py --cfg=cifar10-resnet --batch=64 --norms=gn,none --precisions=fp32,bf16 --out=speed.json
    python bench/train_speed.py --cfg=gn-stylegan --resolution=64 --batch=8

For every preset, discriminator constraint (--norms), fast-G setting (--fast-g; only meaningful for
the GN variants), GN's D step in affine form or plain (--linear-d; GN only, see training/gradnorm.py),
one or separate D calls per D step (--fuse-d) and precision (--precisions), it
builds G, D, GANLoss and the two Adam optimizers from training/configs.get_config, as the training
loop does, and times one D step (zero_grad, GANLoss.accumulate_gradients('D', ...), optimizer
step) and one G step, on random images and latents (the data pipeline is not part of the measurement). Runs alternate between the
configurations, one D step and one G step of each per round, so that a change in the machine's
load hits all of them alike; every figure is the median over --rounds rounds after --warmup
untimed ones. A full iteration of a preset is n_dis D steps plus one G step.

Reported: sec/D step, sec/G step, sec/iteration, and for each preset and precision the ratios
GN / vanilla (norm 'none') of the D step and of the G step, the figures of the GN-GAN paper's
speed table. fp16 runs use a GradScaler as the training loop does. Prints a table; --out writes
the same numbers as JSON with the device, torch version, thread count, load average and date.

On a CPU shared with other work, wall time measures the neighbours as much as the code;
--clock=process --threads=1 times the CPU work of this process alone, which is what the figures in
docs/benchmarks.md use.
"""

from __future__ import annotations

import datetime
import os
import statistics
import sys
import time
from typing import Callable

import click
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dnnlib  # noqa: E402
from bench.stylegan import write_json_atomic  # noqa: E402
from training import configs, loss as loss_lib  # noqa: E402

#----------------------------------------------------------------------------


def build_preset(cfg_name: str, norms: list[str], batch: int | None, resolution: int | None, cmax: int | None,
                 device: torch.device) -> dict:
    """The networks, optimizers and batches of one preset, shared by all of its configurations.

    Every norm except 'sn' uses the same D (sn builds D with spectral normalization), so one D
    (two with sn) and one G serve every configuration; their weights drift as the benchmark
    trains them, which changes nothing in the arithmetic being timed.
    """
    cfg = configs.get_config(cfg_name)
    if cfg.get('progressive') is not None:
        if resolution is None or batch is None:
            raise click.ClickException(f'--cfg={cfg_name} has no fixed resolution or batch: pass --resolution and --batch')
        img_resolution, batch_D, batch_G = resolution, batch, batch
        if cmax is not None:
            cfg.G_kwargs.fmap_max = cfg.D_kwargs.fmap_max = cmax
    else:
        img_resolution = cfg.resolution
        batch_D = cfg.batch_D if batch is None else batch
        batch_G = batch_D * cfg.batch_G // cfg.batch_D
    c_dim = 10 if cfg.conditional else 0
    common = dict(c_dim=c_dim, img_resolution=img_resolution, img_channels=3)
    torch.manual_seed(0)
    G = dnnlib.util.construct_class_by_name(**cfg.G_kwargs, **common).train().requires_grad_(False).to(device)
    Ds = {}
    for spectral_norm in sorted({norm == 'sn' for norm in norms}):
        D_kwargs = dnnlib.EasyDict(cfg.D_kwargs, spectral_norm=spectral_norm)
        Ds[spectral_norm] = dnnlib.util.construct_class_by_name(**D_kwargs, **common).train().requires_grad_(False).to(device)
    G_opt = dnnlib.util.construct_class_by_name(params=G.parameters(), **cfg.G_opt_kwargs)
    D_opts = {sn: dnnlib.util.construct_class_by_name(params=D.parameters(), **cfg.D_opt_kwargs) for sn, D in Ds.items()}

    def labels(n: int) -> torch.Tensor:
        if c_dim == 0:
            return torch.zeros([n, 0], device=device)
        return torch.nn.functional.one_hot(torch.randint(c_dim, [n], device=device), c_dim).float()

    return dict(cfg=cfg, G=G, Ds=Ds, G_opt=G_opt, D_opts=D_opts, batch_D=batch_D, batch_G=batch_G,
                resolution=img_resolution, labels=labels)


class Configuration:
    """One (preset, norm, fast_g, linear_d, fuse, precision): its GANLoss and a timed D step and G step."""

    def __init__(self, preset: dict, norm: str, fast_g: bool | None, linear_d: bool | None, fuse: bool | None,
                 precision: str, device: torch.device, clock: Callable[[], float]) -> None:
        self.preset, self.norm, self.fast_g, self.precision, self.device = preset, norm, fast_g, precision, device
        self.clock = clock
        cfg = preset['cfg']
        self.D = preset['Ds'][norm == 'sn']
        self.D_opt = preset['D_opts'][norm == 'sn']
        loss_kwargs = dnnlib.EasyDict(cfg.loss_kwargs, norm=norm)
        if fast_g is not None:
            loss_kwargs.fast_g = fast_g
        if fuse is not None:
            loss_kwargs.fuse_d_calls = fuse
        if linear_d is not None:
            loss_kwargs.linear_d = linear_d
        if precision != 'fp32':  # The loss's default is the paper's fp32.
            loss_kwargs.precision = precision
        self.loss = dnnlib.util.construct_class_by_name(**loss_kwargs, G=preset['G'], D=self.D)
        self.scaler = torch.amp.GradScaler(device.type, enabled=(precision == 'fp16'))
        if norm in loss_lib.GN_ZETAS and fast_g is None:
            self.fast_g = self.loss.fast_g
        self.times: dict[str, list[float]] = {'D': [], 'G': []}

    def step(self, phase: str, record: bool) -> None:
        p = self.preset
        module, opt = (self.D, self.D_opt) if phase == 'D' else (p['G'], p['G_opt'])
        n = p['batch_D'] if phase == 'D' else p['batch_G']
        real = torch.rand([p['batch_D'], 3, p['resolution'], p['resolution']], device=self.device) * 2 - 1
        real_c, gen_z, gen_c = p['labels'](p['batch_D']), torch.randn([n, p['G'].z_dim], device=self.device), p['labels'](n)
        loss_lib.set_matmul_precision(self.precision)
        self._sync()
        start = self.clock()
        module.requires_grad_(True)
        opt.zero_grad(set_to_none=True)
        gain = self.scaler.scale(torch.ones([], device=self.device)) if self.scaler.is_enabled() else 1.0
        self.loss.accumulate_gradients(phase, real, real_c, gen_z, gen_c, gain=gain)
        self.scaler.step(opt)
        self.scaler.update()
        module.requires_grad_(False)
        self._sync()
        if record:
            self.times[phase].append(self.clock() - start)

    def _sync(self) -> None:
        if self.device.type == 'cuda':
            torch.cuda.synchronize(self.device)

    def result(self) -> dict:
        d, g = statistics.median(self.times['D']), statistics.median(self.times['G'])
        n_dis = self.preset['cfg'].n_dis
        linear_d = self.loss.bias_layers is not None if self.norm in loss_lib.GN_ZETAS else None
        return dict(cfg=self.preset['cfg'].name, norm=self.norm, fast_g=self.fast_g, linear_d=linear_d,
                    fuse_d_calls=self.loss.fuse_d_calls, precision=self.precision,
                    batch_D=self.preset['batch_D'], batch_G=self.preset['batch_G'], resolution=self.preset['resolution'],
                    n_dis=n_dis, sec_per_D_step=d, sec_per_G_step=g, sec_per_iteration=n_dis * d + g,
                    rounds=len(self.times['D']))

#----------------------------------------------------------------------------


def parse_list(choices: tuple[str, ...]):
    def callback(ctx: click.Context, param: click.Parameter, value: str) -> list[str]:
        items = [v for v in value.split(',') if v]
        unknown = [v for v in items if v not in choices]
        if unknown or not items:
            raise click.BadParameter(f'expected a comma-separated list of {", ".join(choices)}; got "{value}"')
        return items
    return callback


def ratios(rows: list[dict]) -> list[dict]:
    """GN / vanilla per preset, precision, fast-G, affine-D and fused-D setting: D step, G step and full iteration."""
    out = []
    for row in rows:
        if row['norm'] != 'gn':
            continue
        base = next((r for r in rows if r['norm'] == 'none' and r['cfg'] == row['cfg']
                     and r['precision'] == row['precision'] and r['fuse_d_calls'] == row['fuse_d_calls']), None)
        if base is not None:
            out.append(dict(cfg=row['cfg'], precision=row['precision'], fast_g=row['fast_g'], linear_d=row['linear_d'],
                            fuse_d_calls=row['fuse_d_calls'],
                            D=row['sec_per_D_step'] / base['sec_per_D_step'],
                            G=row['sec_per_G_step'] / base['sec_per_G_step'],
                            iteration=row['sec_per_iteration'] / base['sec_per_iteration']))
    return out


@click.command()
@click.option('--cfg', 'cfg_names', help='Presets, comma-separated', default='cifar10-resnet', show_default=True,
              callback=parse_list(tuple(configs.PRESETS)))
@click.option('--norms', help='Discriminator constraints, comma-separated', default='gn,none,sn,gp1', show_default=True,
              callback=parse_list(loss_lib.NORMS))
@click.option('--fast-g', 'fast_g', help='Fast GN generator step: on, off, or both (GN norms only)',
              type=click.Choice(['both', 'on', 'off', 'default']), default='both', show_default=True)
@click.option('--linear-d', 'linear_d', help='GN D step with f in affine form: on, off, both, or GANLoss\'s default (on '
              'where D qualifies)', type=click.Choice(['default', 'both', 'on', 'off']), default='default', show_default=True)
@click.option('--fuse-d', 'fuse_d', help='One D call on reals + fakes: on, off, both, or GANLoss\'s default for the device',
              type=click.Choice(['default', 'both', 'on', 'off']), default='default', show_default=True)
@click.option('--precisions', help='Precisions, comma-separated', default='fp32', show_default=True,
              callback=parse_list(loss_lib.PRECISIONS))
@click.option('--batch', help='D batch M (G gets the preset\'s ratio)  [default: the preset\'s]', type=click.IntRange(min=2))
@click.option('--resolution', help='gn-stylegan: resolution of the networks (lod 0)', type=click.IntRange(min=8))
@click.option('--cmax', help='gn-stylegan: maximum feature maps per layer', type=click.IntRange(min=1))
@click.option('--rounds', help='Timed rounds (one D and one G step of every configuration each)', type=click.IntRange(min=1),
              default=5, show_default=True)
@click.option('--warmup', help='Untimed rounds first', type=click.IntRange(min=0), default=1, show_default=True)
@click.option('--threads', help='torch intra-op threads  [default: torch\'s]', type=click.IntRange(min=1))
@click.option('--clock', help='wall: elapsed time; process: CPU time of this process (a CPU run on a shared machine, '
              'with --threads=1)', type=click.Choice(['wall', 'process']), default='wall', show_default=True)
@click.option('--out', help='JSON file for the results', metavar='PATH')
def main(cfg_names: list[str], norms: list[str], fast_g: str, linear_d: str, fuse_d: str, precisions: list[str], batch: int | None,
         resolution: int | None, cmax: int | None, rounds: int, warmup: int, threads: int | None, clock: str,
         out: str | None) -> None:
    """Seconds per D step and per G step of the presets, for each norm, fast-G setting and precision."""
    device = torch.device('cuda') if torch.cuda.is_available() else torch.device('cpu')
    if threads is not None:
        torch.set_num_threads(threads)
    if device.type == 'cuda':
        torch.backends.cudnn.benchmark = True
    if clock == 'process' and device.type == 'cuda':
        raise click.ClickException('--clock=process measures CPU time, which says nothing about GPU work; use --clock=wall')
    clock_fn = time.perf_counter if clock == 'wall' else time.process_time
    settings = {'both': [True, False], 'on': [True], 'off': [False], 'default': [None]}
    fast_settings, linear_settings, fuse_settings = settings[fast_g], settings[linear_d], settings[fuse_d]

    runs = []
    for name in cfg_names:
        preset = build_preset(name, norms, batch, resolution, cmax, device)
        for norm in norms:
            gn = norm in loss_lib.GN_ZETAS
            for fast in (fast_settings if gn else [None]):
                for linear in (linear_settings if gn else [None]):
                    for fuse in fuse_settings:
                        for precision in precisions:
                            runs.append(Configuration(preset, norm, fast, linear, fuse, precision, device, clock_fn))
    for round_idx in range(warmup + rounds):
        for run in runs:
            for phase in ('D', 'G'):
                run.step(phase, record=round_idx >= warmup)
    loss_lib.set_matmul_precision('fp32')

    rows = [run.result() for run in runs]
    on_off = lambda flag: '' if flag is None else ('on' if flag else 'off')
    print(f'{"cfg":<20} {"norm":<5} {"fast_g":<6} {"lin_d":<6} {"fuse_d":<6} {"prec":<5} {"batch":>7} {"s/D step":>9} {"s/G step":>9} '
          f'{"s/iter":>8}')
    for r in rows:
        print(f'{r["cfg"]:<20} {r["norm"]:<5} {on_off(r["fast_g"]):<6} {on_off(r["linear_d"]):<6} {on_off(r["fuse_d_calls"]):<6} {r["precision"]:<5} '
              f'{r["batch_D"]:>3}/{r["batch_G"]:<3} '
              f'{r["sec_per_D_step"]:>9.4f} {r["sec_per_G_step"]:>9.4f} {r["sec_per_iteration"]:>8.3f}')
    gn_ratios = ratios(rows)
    if gn_ratios:
        print('\nGN / vanilla (norm none):')
        for r in gn_ratios:
            print(f'{r["cfg"]:<20} {r["precision"]:<5} fast_g {on_off(r["fast_g"]):<4} lin_d {on_off(r["linear_d"]):<4} fuse_d {on_off(r["fuse_d_calls"]):<4} '
                  f'D {r["D"]:.2f}  G {r["G"]:.2f}  iteration {r["iteration"]:.2f}')

    if out is not None:
        write_json_atomic(out, dict(
            benchmark='training step of the presets (GANLoss.accumulate_gradients + Adam), medians',
            device=torch.cuda.get_device_name(device) if device.type == 'cuda' else f'CPU ({os.cpu_count()} cores)',
            threads=torch.get_num_threads(),
            clock=clock,
            load_average=os.getloadavg(),
            torch=torch.__version__,
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
            rounds=rounds, warmup=warmup, results=rows, gn_over_vanilla=gn_ratios))
        print(f'Results written to {out}')


if __name__ == '__main__':
    main()  # pylint: disable=no-value-for-parameter
