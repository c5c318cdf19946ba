"""How far GN training gradients move from float64 under each --precision, for the presets' networks.

    python bench/precision.py                                           # the 32x32 and 48x48 presets, batch 8
    python bench/precision.py --cfg=cifar10-resnet,cifar10-biggan --precisions=fp32,bf16,fp16 --out=precision.json

For each fixed-resolution preset it builds G and D from training/configs.get_config at their real
widths, copies both to float64, and runs one D step and one G step of
GANLoss (each of --norms, the preset's loss) on the same reals, latents and labels: once in
float64 (the reference) and once per precision on the float32 networks. Reported per precision,
relative to float64:

    D grad    ||g - g64|| / ||g64|| of all D parameter gradients of the D step
    G grad    the same for the G parameters in the G step (the preset's G path: fast where exact)
    score     max abs error of the reals' scores (f_hat under GN, |f_hat| <= 1; the raw f otherwise)
    ||grad||  GN: max relative error of ||grad_x f|| of the reals, the quantity GN divides by

--norms=gn,none also measures the unnormalized baseline, to tell GN's sensitivity from the
precision's own.
'tf32' only differs from 'fp32' on a CUDA GPU with TF32 tensor cores (elsewhere its row repeats
fp32's); fp16 rounds to the same 10-bit mantissa as TF32 and more (activations too), so on a CPU it
bounds TF32's error from above. fp16 gradients are loss-scaled as a GradScaler would (2^16,
halved while they overflow). Several seeds (--seeds) give the spread. Prints a table; --out writes JSON.
"""

from __future__ import annotations

import copy
import datetime
import os
import sys

import click
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dnnlib  # noqa: E402
from bench.stylegan import write_json_atomic  # noqa: E402
from bench.train_speed import parse_list  # noqa: E402
from training import configs, loss as loss_lib  # noqa: E402

#----------------------------------------------------------------------------

# gn-stylegan is left out: its mapping network and D cast to float32 inside, so it has no float64 reference.
FLOAT64_PRESETS = tuple(name for name, preset in configs.PRESETS.items() if preset['resolution'] is not None)


def gradients(G: torch.nn.Module, D: torch.nn.Module, loss_name: str, norm: str, precision: str, batch: dict,
              seed: int) -> dict[str, torch.Tensor]:
    """D-step gradients of D, G-step gradients of G, and the reals' scores and (GN) ||grad_x f||, all in float64."""
    loss = loss_lib.GANLoss(G=G, D=D, loss=loss_name, norm=norm, precision=precision, channels_last=False)
    dtype = next(D.parameters()).dtype
    real, real_c, z_D, z_G, c_G = (t.to(dtype) for t in batch.values())
    out = {}
    for phase, module, z, c in [('D', D, z_D, real_c), ('G', G, z_G, c_G)]:
        module.requires_grad_(True)
        scale = 2.0 ** 16 if precision == 'fp16' else 1.0  # Loss scaling as torch.amp.GradScaler does it:
        while True:                                          # start at 2^16, halve while gradients overflow.
            module.zero_grad(set_to_none=True)
            loss.accumulate_gradients(phase, real, real_c, z, c, gain=scale)
            grad = torch.cat([p.grad.flatten() for p in module.parameters() if p.grad is not None]).double() / scale
            if scale <= 1 or torch.isfinite(grad).all():
                break
            scale /= 2
        out[phase] = grad
        module.requires_grad_(False)
        module.zero_grad(set_to_none=True)
    D.requires_grad_(True)
    f_hat, grad_norm = loss.scores(real, real_c)
    out['f_hat'] = f_hat.detach().double()
    out['norm'] = None if grad_norm is None else grad_norm.detach().double()
    D.requires_grad_(False)
    return out


def compare(cfg_name: str, norm: str, precisions: list[str], batch_size: int, seed: int) -> list[dict]:
    cfg = configs.get_config(cfg_name)
    resolution = cfg.resolution
    c_dim = 10 if cfg.conditional else 0
    common = dict(c_dim=c_dim, img_resolution=resolution, img_channels=3)
    torch.manual_seed(seed)
    G = dnnlib.util.construct_class_by_name(**cfg.G_kwargs, **common).train().requires_grad_(False)
    D = dnnlib.util.construct_class_by_name(**cfg.D_kwargs, **common).train().requires_grad_(False)
    labels = lambda n: (torch.nn.functional.one_hot(torch.randint(c_dim, [n]), c_dim).float() if c_dim
                        else torch.zeros([n, 0]))
    batch_G = batch_size * cfg.batch_G // cfg.batch_D
    batch = dict(real=torch.rand([batch_size, 3, resolution, resolution]) * 2 - 1, real_c=labels(batch_size),
                 z_D=torch.randn([batch_size, G.z_dim]), z_G=torch.randn([batch_G, G.z_dim]), c_G=labels(batch_G))
    reference = gradients(copy.deepcopy(G).double(), copy.deepcopy(D).double(), cfg.loss_kwargs.loss, norm, 'fp32', batch, seed)
    rows = []
    for precision in precisions:
        loss_lib.set_matmul_precision(precision)
        got = gradients(copy.deepcopy(G), copy.deepcopy(D), cfg.loss_kwargs.loss, norm, precision, batch, seed)
        rel = lambda key: ((got[key] - reference[key]).norm() / reference[key].norm()).item()
        norm_err = (None if reference['norm'] is None
                    else ((got['norm'] - reference['norm']).abs() / reference['norm']).max().item())
        rows.append(dict(cfg=cfg_name, norm=norm, resolution=resolution, batch=batch_size, seed=seed, precision=precision,
                         D_grad_rel_err=rel('D'), G_grad_rel_err=rel('G'),
                         score_max_abs_err=(got['f_hat'] - reference['f_hat']).abs().max().item(),
                         grad_norm_max_rel_err=norm_err))
    loss_lib.set_matmul_precision('fp32')
    return rows


@click.command()
@click.option('--cfg', 'cfg_names', help='Presets, comma-separated',
              default='cifar10-cnn,cifar10-resnet,stl10-cnn,stl10-resnet,cifar10-biggan', show_default=True,
              callback=parse_list(FLOAT64_PRESETS))
@click.option('--precisions', help='Precisions, comma-separated', default='fp32,bf16,fp16', show_default=True,
              callback=parse_list(loss_lib.PRECISIONS))
@click.option('--norms', help='Discriminator constraints, comma-separated (none: the unnormalized baseline)',
              default='gn,none', show_default=True, callback=parse_list(loss_lib.NORMS))
@click.option('--batch', help='D batch (G gets the preset\'s ratio)', type=click.IntRange(min=2), default=8, show_default=True)
@click.option('--seeds', help='Number of seeds (networks and batches)', type=click.IntRange(min=1), default=2, show_default=True)
@click.option('--out', help='JSON file for the results', metavar='PATH')
def main(cfg_names: list[str], norms: list[str], precisions: list[str], batch: int, seeds: int, out: str | None) -> None:
    """Relative error of GN training gradients against float64, per preset and precision."""
    rows = []
    print(f'{"cfg":<20} {"norm":<5} {"seed":>4} {"prec":<5} {"D grad":>9} {"G grad":>9} {"score":>9} {"||grad||":>9}',
          flush=True)
    for name in cfg_names:
        for norm in norms:
            for seed in range(seeds):
                for r in compare(name, norm, precisions, batch, seed):
                    rows.append(r)
                    norm_err = '' if r['grad_norm_max_rel_err'] is None else f'{r["grad_norm_max_rel_err"]:.2e}'
                    print(f'{r["cfg"]:<20} {norm:<5} {seed:>4} {r["precision"]:<5} {r["D_grad_rel_err"]:>9.2e} '
                          f'{r["G_grad_rel_err"]:>9.2e} {r["score_max_abs_err"]:>9.2e} {norm_err:>9}', flush=True)
    if out is not None:
        write_json_atomic(out, dict(
            benchmark='relative error of GN training gradients against float64 (GANLoss, one D and one G step)',
            device='cuda' if torch.cuda.is_available() else f'CPU ({os.cpu_count()} cores)', torch=torch.__version__,
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'), results=rows))
        print(f'Results written to {out}')


if __name__ == '__main__':
    main()  # pylint: disable=no-value-for-parameter
