"""How far GN training gradients move from float64 under each --precision, for the presets' networks.

    python -m bench.precision                                           # the 32x32 and 48x48 presets, batch 8
    python -m bench.precision --cfg=cifar10-resnet,cifar10-biggan --precisions=fp32,bf16,fp16 --out=precision.json
    python -m bench.precision --cfg=gn-stylegan --resolution=32 --cmax=128 --norms=gn,r1,none

For each preset it builds G and D with an Experiment (training/experiment.py) at their real widths
(gn-stylegan: for --resolution, feature maps capped at --cmax, set to --lod, style mixing off),
copies both to float64, and runs the training loop's D step and G step (NetworkUpdater.accumulate
of training/step/updater.py on GANLoss; each of --norms, the preset's loss) on the same reals, latents
and labels: once in float64 (the reference) and once per precision on the float32 networks.
StyleGAN draws per-pixel noise at every call, which float64 and float32 draw differently; its
strengths start at 0, so the noise changes no value, but the strengths' own gradients are left out
of the comparison. Reported per precision, relative to float64:

    D grad    ||g - g64|| / ||g64|| of all D parameter gradients of the D step
    G grad    the same for the G parameters in the G step (the preset's G path: fast where exact)
    score     max abs error of the reals' scores (f_hat under GN, |f_hat| <= 1; the raw f otherwise)
    ||grad||  GN: max relative error of ||grad_x f|| of the reals, the quantity GN divides by
    kinks     inputs of a ReLU or LeakyReLU (D and G, both steps) on the other side of the kink from float64's:
              each switches a unit's gradient on or off, a jump that no rounding bound covers (the float32
              figures of 1e-4 instead of 1e-6 are such crossings); '-' where the calls do not pair up

--norms=gn,none also measures the unnormalized baseline, to tell GN's sensitivity from the
precision's own.

The low-precision convolutions run on oneDNN's kernels for the best instruction set the CPU has
(AMX tiles, AVX-512 BF16, ...), and the kernel set changes the rounding (docs/precision.md). Every row
names it: `isa`, the ONEDNN_MAX_CPU_ISA it ran under ('default': none set, the CPU's best), and
`kernels`, the implementation oneDNN picks for a bf16 convolution there ('aten': not oneDNN's).
--isa=all runs every ISA this CPU offers (each in a process of its own, since oneDNN reads the variable
once), --isa=AVX512_CORE,AVX2 the ones named:

    python -m bench.precision --cfg=cifar10-resnet --batch=4 --seeds=1 --precisions=bf16 --isa=all

GN's D step is the loss's default for each precision (the affine form in float32, the plain double backward
under bf16/fp16 autocast: training/step/loss.py); --linear-d=both measures both forms (the float64 reference
is the same either way). --device=cuda measures a GPU (tf32 there rounds the convolutions' inputs to TF32).
'tf32' only differs from 'fp32' on a CUDA GPU with TF32 tensor cores (elsewhere its row repeats
fp32's); fp16 rounds to the same 10-bit mantissa as TF32 and more (activations too), so on a CPU it
bounds TF32's error from above. fp16 gradients are loss-scaled as a GradScaler would (2^16,
halved while they overflow). Several seeds (--seeds) give the spread. Prints a table; --out writes JSON.
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import copy
import datetime
import itertools
import json
import os
import subprocess
import sys
import tempfile

import click

import torch

from torch.utils._python_dispatch import TorchDispatchMode

from bench.common import (build_network, parse_list, preset_experiment, random_batch, step_switches, training_step,
                          write_json_atomic)
from torch_utils import devices
from training.recipes import configs
from training.step import loss as loss_lib
from training.step.precision import PRECISIONS

#----------------------------------------------------------------------------

NOT_COMPARED = 'noise_strength'  # StyleGAN's noise strengths: their gradients depend on the random noise of each call.
ISA_VARIABLE = 'ONEDNN_MAX_CPU_ISA'
# oneDNN's x86 instruction-set caps, best first, each with the /proc/cpuinfo flags it needs.
ISAS = {
    'AVX512_CORE_AMX': ('amx_tile', 'amx_bf16', 'avx512_bf16'),
    'AVX512_CORE_BF16': ('avx512_bf16', 'avx512_vnni'),
    'AVX512_CORE_VNNI': ('avx512_vnni', 'avx512f', 'avx512bw', 'avx512vl', 'avx512dq'),
    'AVX512_CORE': ('avx512f', 'avx512bw', 'avx512vl', 'avx512dq'),
    'AVX2': ('avx2', 'fma'),
}


class KinkInputs(TorchDispatchMode):
    """Records the input of every ReLU and LeakyReLU call, in float64, in call order."""
    OPS = (torch.ops.aten.relu.default, torch.ops.aten.relu_.default, torch.ops.aten.leaky_relu.default,
           torch.ops.aten.leaky_relu_.default)

    def __init__(self) -> None:
        super().__init__()
        self.inputs = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.OPS:
            self.inputs.append(args[0].detach().double())
        return func(*args, **(kwargs or {}))

    def crossings(self, reference: KinkInputs) -> int | None:
        """How many recorded inputs lie on the other side of 0 than the reference's; None if the calls do not pair up."""
        if [x.shape for x in self.inputs] != [x.shape for x in reference.inputs]:
            return None
        return sum(int(((x > 0) != (r > 0)).sum()) for x, r in zip(self.inputs, reference.inputs))


def cpu_isas() -> list[str]:
    """The ISAS this CPU offers, best first (Linux on x86: /proc/cpuinfo's flags; elsewhere none)."""
    try:
        with open('/proc/cpuinfo') as f:
            flags = set(next(line for line in f if line.startswith('flags')).split(':', 1)[1].split())
    except (OSError, StopIteration):
        return []
    return [isa for isa, needs in ISAS.items() if flags.issuperset(needs)]


def kernel_set(device: torch.device = torch.device('cpu')) -> str:
    """The implementation oneDNN runs a bf16 convolution on in this process (e.g. 'brg_conv_fwd:avx512_core_amx',
    'jit_bf16:avx512_core_bf16'), read from its verbose log; 'aten' where PyTorch computes it without oneDNN; on a
    GPU, its name."""
    if device.type == 'cuda':
        return torch.cuda.get_device_name(device)
    x, w = torch.randn(1, 32, 8, 8), torch.randn(32, 32, 3, 3)
    sys.stdout.flush()
    with tempfile.TemporaryFile('w+') as log:
        saved = os.dup(1)  # oneDNN writes to the process's stdout, below Python.
        os.dup2(log.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON), torch.autocast('cpu', dtype=torch.bfloat16):
                torch.nn.functional.conv2d(x, w)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        log.seek(0)
        for fields in (line.split(',') for line in log):
            if 'exec' in fields and 'convolution' in fields:
                return fields[fields.index('convolution') + 1]
    return 'aten'


def gradients(G: torch.nn.Module, D: torch.nn.Module, loss_kwargs: dict, precision: str, batch: dict) -> dict[str, torch.Tensor]:
    """D-step gradients of D, G-step gradients of G, and the reals' scores and (GN) ||grad_x f||, all in float64.

    The gradients are those the training loop's step computes (NetworkUpdater.accumulate), unscaled as its
    GradScaler unscales them before the optimizer step; while fp16 gradients overflow, the scaler backs off
    (halves its scale) and the step is computed again, as training skips such steps."""
    optimizers = [torch.optim.SGD(net.parameters(), lr=0.0) for net in (G, D)]  # Never stepped: for the scaler.
    training = training_step(G, D, *optimizers, loss_kwargs, precision=precision, lay_out=False)
    with step_switches(training):  # Restored afterwards.
        dtype = next(D.parameters()).dtype
        real, real_c, z_D, z_G, c_G = (t.to(dtype) for t in batch.values())
        out = {}
        for net, z, c in [('D', z_D, real_c), ('G', z_G, c_G)]:
            updater = training.updaters[net]
            while True:
                updater.accumulate(training.loss, [real, real_c, z, c], rounds=1)
                updater.scaler.unscale_(updater.optimizer)  # A no-op for a disabled scaler (every precision but fp16).
                grad = torch.cat([p.grad.flatten() for name, p in updater.module.named_parameters()
                                  if p.grad is not None and NOT_COMPARED not in name]).double()
                if torch.isfinite(grad).all() or not updater.scaler.is_enabled() or updater.scaler.get_scale() <= 1:
                    break
                updater.scaler.update()  # Overflow recorded by unscale_: back off.
            out[net] = grad
            updater.optimizer.zero_grad(set_to_none=True)
        D.requires_grad_(True)
        f_hat, grad_norm = training.loss.scores(real, real_c)
        out['f_hat'] = f_hat.detach().double()
        out['norm'] = None if grad_norm is None else grad_norm.detach().double()
        D.requires_grad_(False)
    return out


def compare(cfg_name: str, norm: str, precisions: list[str], batch_size: int, seed: int, resolution: int, cmax: int,
            lod: float, linear_d: str = 'default', device: torch.device = torch.device('cpu')) -> list[dict]:
    progressive = configs.get_config(cfg_name).arch == 'stylegan'
    # Style mixing and augmentation draw at random per call: not comparable between float64 and float32.
    opts = preset_experiment(cfg_name, norm=norm, batch=batch_size, resolution=resolution if progressive else None,
                             cmax=cmax if progressive else None, style_mixing=0 if progressive else None, aug='noaug')
    G, D = build_network(opts.G_kwargs, device, seed), build_network(opts.D_kwargs, device, seed)
    active = G.img_resolution
    if progressive:
        G.set_lod(lod)
        D.set_lod(lod)
        active = G.img_resolution // 2 ** int(lod)
    batch_G = opts.schedule_kwargs.get('batch_G', batch_size)
    real, real_c, z_D, _ = random_batch(G, batch_size, active, device)
    _, _, z_G, c_G = random_batch(G, batch_G, active, device)
    batch = dict(real=real, real_c=real_c, z_D=z_D, z_G=z_G, c_G=c_G)
    with KinkInputs() as reference_kinks:
        reference = gradients(copy.deepcopy(G).double(), copy.deepcopy(D).double(), opts.loss_kwargs, 'fp32', batch)
    rows = []
    isa, kernels = os.environ.get(ISA_VARIABLE, 'default'), kernel_set(device)
    loss_kwargs = opts.loss_kwargs  # GN's D step in its affine form or plainly as asked (the reference: either, in float64).
    if linear_d != 'default' and loss_lib.CONSTRAINTS[norm].gn_zeta is not None:
        loss_kwargs = dict(loss_kwargs, linear_d=linear_d == 'on')
    for precision in precisions:
        with KinkInputs() as kinks:
            got = gradients(copy.deepcopy(G), copy.deepcopy(D), loss_kwargs, precision, batch)
        rel = lambda key: ((got[key] - reference[key]).norm() / reference[key].norm()).item()
        norm_err = (None if reference['norm'] is None
                    else ((got['norm'] - reference['norm']).abs() / reference['norm']).max().item())
        rows.append(dict(cfg=cfg_name, norm=norm, resolution=G.img_resolution, batch=batch_size, seed=seed,
                         precision=precision, linear_d=linear_d, isa=isa, kernels=kernels, D_grad_rel_err=rel('D'), G_grad_rel_err=rel('G'),
                         score_max_abs_err=(got['f_hat'] - reference['f_hat']).abs().max().item(),
                         grad_norm_max_rel_err=norm_err, kink_crossings=kinks.crossings(reference_kinks)))
    return rows


def measure(cfg_names: list[str], norms: list[str], precisions: list[str], batch: int, seeds: int, resolution: int,
            cmax: int, lod: float, linear_ds: list[str], device: torch.device) -> list[dict]:
    """Every (preset, norm, seed)'s rows in this process, each printed as it comes."""
    rows = []
    print(f'{"cfg":<20} {"norm":<5} {"lin_d":<7} {"seed":>4} {"prec":<5} {"D grad":>9} {"G grad":>9} {"score":>9} {"||grad||":>9} {"kinks":>6}  '
          f'kernels ({ISA_VARIABLE})', flush=True)
    for name in cfg_names:
        for norm in norms:
            gn = loss_lib.CONSTRAINTS[norm].gn_zeta is not None
            for linear_d, seed in itertools.product(linear_ds if gn else ['default'], range(seeds)):
                for r in compare(name, norm, precisions, batch, seed, resolution, cmax, lod, linear_d, device):
                    rows.append(r)
                    norm_err = '' if r['grad_norm_max_rel_err'] is None else f'{r["grad_norm_max_rel_err"]:.2e}'
                    print(f'{r["cfg"]:<20} {norm:<5} {linear_d:<7} {seed:>4} {r["precision"]:<5} {r["D_grad_rel_err"]:>9.2e} '
                          f'{r["G_grad_rel_err"]:>9.2e} {r["score_max_abs_err"]:>9.2e} {norm_err:>9} '
                          f'{"-" if r["kink_crossings"] is None else r["kink_crossings"]:>6}  {r["kernels"]} ({r["isa"]})',
                          flush=True)
    return rows


def measure_under_isa(isa: str, options: list[str]) -> list[dict]:
    """This program's rows with `options`, run in a process of its own under ONEDNN_MAX_CPU_ISA=isa."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, 'rows.json')
        env = dict(os.environ, **{ISA_VARIABLE: isa})
        result = subprocess.run([sys.executable, '-m', 'bench.precision', *options, f'--out={out}'], env=env, check=False)
        if result.returncode != 0:
            raise click.ClickException(f'the run under {ISA_VARIABLE}={isa} failed (exit status {result.returncode})')
        with open(out) as f:
            return json.load(f)['results']


@click.command()
@click.option('--cfg', 'cfg_names', help='Presets, comma-separated',
              default='cifar10-cnn,cifar10-resnet,stl10-cnn,stl10-resnet,cifar10-biggan', show_default=True,
              callback=parse_list(tuple(configs.PRESETS)))
@click.option('--precisions',       help='Precisions, comma-separated', default='fp32,bf16,fp16', show_default=True,
              callback=parse_list(PRECISIONS))
@click.option('--norms',            help='Discriminator constraints, comma-separated (none: the unnormalized baseline)',
              default='gn,none', show_default=True, callback=parse_list(loss_lib.NORMS))
@click.option('--batch',            help='D batch (G gets the preset\'s ratio)', type=click.IntRange(min=2), default=8, show_default=True)
@click.option('--seeds',            help='Number of seeds (networks and batches)', type=click.IntRange(min=1), default=2, show_default=True)
@click.option('--resolution',       help='gn-stylegan: resolution the networks are built for', type=click.IntRange(min=8), default=32, show_default=True)
@click.option('--cmax',             help='gn-stylegan: maximum feature maps per layer', type=click.IntRange(min=1), default=128, show_default=True)
@click.option('--lod',              help='gn-stylegan: level of detail (0: full resolution; 0.5: half-way through a fade-in)', type=click.FloatRange(min=0), default=0.5, show_default=True)
@click.option('--linear-d', 'linear_d', help='GN\'s D step: default (GANLoss\'s choice for the precision), on (affine form), '
                                              'off (plain double backward), or both', type=click.Choice(['default', 'on', 'off', 'both']),
              default='default', show_default=True)
@click.option('--device',           help='cpu, cuda or cuda:N', metavar='DEVICE', default='cpu', show_default=True)
@click.option('--isa',              help=f'oneDNN ISAs ({ISA_VARIABLE}), comma-separated, or all: every one this CPU offers, '
                                         f'each in a process of its own  [default: this process\'s]', metavar='LIST')
@click.option('--out',              help='JSON file for the results', metavar='PATH')
def main(cfg_names: list[str], norms: list[str], precisions: list[str], batch: int, seeds: int, resolution: int, cmax: int,
         lod: float, linear_d: str, device: str, isa: str | None, out: str | None) -> None:
    """Relative error of GN training gradients against float64, per preset and precision."""
    try:
        device = devices.parse_device(device)
    except ValueError as e:
        raise click.ClickException(f'--device: {e}')
    linear_ds = ['on', 'off'] if linear_d == 'both' else [linear_d]
    if isa is None:
        rows = measure(cfg_names, norms, precisions, batch, seeds, resolution, cmax, lod, linear_ds, device)
    else:
        offered = cpu_isas()
        isas = offered if isa == 'all' else [v for v in isa.split(',') if v]
        missing = [v for v in isas if v not in offered]
        if missing or not isas:
            raise click.BadParameter(f'this CPU offers {", ".join(offered) or "no oneDNN x86 ISA"}; got "{isa}"',
                                     param_hint='--isa')
        if device.type != 'cpu':
            raise click.BadParameter('oneDNN\'s ISAs are those of the CPU: --isa runs on --device=cpu', param_hint='--isa')
        options = [f'--cfg={",".join(cfg_names)}', f'--norms={",".join(norms)}', f'--precisions={",".join(precisions)}',
                   f'--batch={batch}', f'--seeds={seeds}', f'--resolution={resolution}', f'--cmax={cmax}', f'--lod={lod}',
                   f'--linear-d={linear_d}']
        rows = [row for value in isas for row in measure_under_isa(value, options)]
    if out is not None:
        write_json_atomic(out, dict(
            benchmark='relative error of GN training gradients against float64 (GANLoss, one D and one G step)',
            device=kernel_set(device) if device.type == 'cuda' else f'CPU ({os.cpu_count()} cores)', torch=torch.__version__,
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'), results=rows))
        print(f'Results written to {out}')


if __name__ == '__main__':
    main()  # pylint: disable=no-value-for-parameter
