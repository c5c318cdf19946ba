"""Generate images with a trained network snapshot.

Examples:

\b
  # 64 images, one PNG per seed, plus one grid of all of them.
  python generate.py --network=training-runs/00000-digits32-quickstart-gn/network-snapshot-000064.pkl \\
      --seeds=0-63 --grid --outdir=out

\b
  # Class-conditional network (BigGAN on CIFAR-10): class 3.
  python generate.py --network=snap.pkl --seeds=0-15 --class=3 --outdir=out

\b
  # GN-StyleGAN: truncation, and a style-mixing grid (rows take coarse styles 0-3 of the columns).
  python generate.py --network=snap.pkl --seeds=0-7 --trunc=0.7 --outdir=out
  python generate.py --network=snap.pkl --mix-rows=0-3 --mix-cols=10-14 --mix-styles=0-3 --outdir=out
"""

from __future__ import annotations

import os

import click
import numpy as np
import torch

import dnnlib
import legacy
from torch_utils import persistence
from torch_utils.misc import save_image_grid

#----------------------------------------------------------------------------


def _load_generator(network: str, device: torch.device, cfg: str | None = None) -> torch.nn.Module:
    try:
        snapshot = legacy.load_network(network, cfg)
    except (OSError, persistence.UnsafeSnapshotError, legacy.OfficialCheckpointError) as e:
        raise click.ClickException(f'--network: {e}')
    G = snapshot.get('G_ema', snapshot.get('G'))
    if G is None:
        raise click.ClickException(f'--network: {network} holds no generator')
    return G.to(device)


def _labels(G: torch.nn.Module, class_idx: int | None, n: int, device: torch.device) -> torch.Tensor:
    c = torch.zeros(n, G.c_dim, device=device)
    if G.c_dim == 0:
        if class_idx is not None:
            raise click.ClickException('--class: this network is unconditional')
        return c
    if class_idx is None:
        raise click.ClickException(f'--class is required: this network is conditional ({G.c_dim} classes)')
    if not 0 <= class_idx < G.c_dim:
        raise click.ClickException(f'--class must be in 0..{G.c_dim - 1}')
    c[:, class_idx] = 1
    return c


def _z(G: torch.nn.Module, seeds: list[int], device: torch.device) -> torch.Tensor:
    """One latent per seed, the same for a seed whatever else is generated with it."""
    return torch.from_numpy(np.stack([np.random.RandomState(s).randn(G.z_dim) for s in seeds])).float().to(device)


def _save_png(img: torch.Tensor, path: str) -> None:
    save_image_grid(img[None], path, grid_size=(1, 1))

#----------------------------------------------------------------------------


@click.command(help=__doc__)
@click.option('--network', 'network', help='Network snapshot file or URL', metavar='PKL_OR_URL', required=True)
@click.option('--cfg', help='Preset of an official GN-GAN checkpoint given as --network', type=click.Choice(legacy.official_cfgs()))
@click.option('--seeds', help='Seeds, e.g. 0-63 or 1,5,9', default='0-7', show_default=True)
@click.option('--trunc', 'truncation_psi', help='Truncation psi (StyleGAN networks; 1 = off)', type=float, default=1, show_default=True)
@click.option('--trunc-cutoff', 'truncation_cutoff', help='Truncate only the first N style layers (StyleGAN)', type=click.IntRange(min=0))
@click.option('--class', 'class_idx', help='Class label (conditional networks)', type=click.IntRange(min=0))
@click.option('--noise-mode', help='Per-layer noise (StyleGAN)', type=click.Choice(['const', 'random', 'none']), default='const', show_default=True)
@click.option('--grid', help='Also write all seeds as one image grid.png', is_flag=True)
@click.option('--mix-rows', help='Style mixing: seeds giving the rows (StyleGAN)', metavar='SEEDS')
@click.option('--mix-cols', help='Style mixing: seeds giving the columns (StyleGAN)', metavar='SEEDS')
@click.option('--mix-styles', help='Style mixing: layers the rows take from the columns', default='0-6', show_default=True)
@click.option('--outdir', help='Where to write the images', metavar='DIR', required=True)
@click.option('--batch', help='Images per forward pass', type=click.IntRange(min=1), default=16, show_default=True)
def main(network: str, cfg: str | None, seeds: str, truncation_psi: float, truncation_cutoff: int | None, class_idx: int | None,
         noise_mode: str, grid: bool, mix_rows: str | None, mix_cols: str | None, mix_styles: str, outdir: str,
         batch: int) -> None:
    device = torch.device('cuda') if torch.cuda.is_available() else torch.device('cpu')
    try:
        seed_list = dnnlib.util.parse_int_list(seeds)
        mix = [dnnlib.util.parse_int_list(v) if v is not None else None for v in (mix_rows, mix_cols)]
        style_list = dnnlib.util.parse_int_list(mix_styles)
    except ValueError as e:
        raise click.ClickException(str(e))
    if (mix[0] is None) != (mix[1] is None):
        raise click.ClickException('--mix-rows and --mix-cols go together')

    G = _load_generator(network, device, cfg)
    is_stylegan = hasattr(G, 'mapping') and hasattr(G, 'synthesis')
    style_kwargs = {}
    if is_stylegan:
        style_kwargs = dict(truncation_psi=truncation_psi, truncation_cutoff=truncation_cutoff, noise_mode=noise_mode)
    elif truncation_psi != 1 or truncation_cutoff is not None or mix[0] is not None:
        raise click.ClickException('--trunc, --trunc-cutoff and style mixing need a StyleGAN snapshot')
    os.makedirs(outdir, exist_ok=True)

    if mix[0] is not None:
        _style_mixing_grid(G, mix[0], mix[1], style_list, class_idx, truncation_psi, truncation_cutoff, noise_mode,
                           device, outdir)
        return

    images = []
    with torch.no_grad():
        for i in range(0, len(seed_list), batch):
            chunk = seed_list[i:i + batch]
            img = G(_z(G, chunk, device), _labels(G, class_idx, len(chunk), device), **style_kwargs).cpu()
            for seed, im in zip(chunk, img):
                _save_png(im, os.path.join(outdir, f'seed{seed:04d}.png'))
            images.append(img)
    print(f'Wrote {len(seed_list)} images to {outdir}')
    if grid:
        gw = int(np.ceil(np.sqrt(len(seed_list))))
        gh = int(np.ceil(len(seed_list) / gw))
        images = torch.cat(images)
        images = torch.cat([images, -torch.ones(gw * gh - len(seed_list), *images.shape[1:])])  # Black padding.
        save_image_grid(images, os.path.join(outdir, 'grid.png'), (gw, gh))
        print(f'Wrote {os.path.join(outdir, "grid.png")}')


def _style_mixing_grid(G, row_seeds, col_seeds, styles, class_idx, psi, cutoff, noise_mode, device, outdir) -> None:
    """StyleGAN's figure: top row = column seeds, left column = row seeds, cells = row seed with the
    listed style layers taken from the column seed."""
    if any(not 0 <= s < G.num_ws for s in styles):
        raise click.ClickException(f'--mix-styles must lie in 0..{G.num_ws - 1}')
    seeds = list(dict.fromkeys(row_seeds + col_seeds))
    with torch.no_grad():
        ws = G.mapping(_z(G, seeds, device), _labels(G, class_idx, len(seeds), device),
                       truncation_psi=psi, truncation_cutoff=cutoff)
        w_of = dict(zip(seeds, ws))
        cells = []
        for row in [None] + row_seeds:
            for col in [None] + col_seeds:
                if row is None and col is None:
                    cells.append(None)
                    continue
                w = w_of[row if row is not None else col].clone()
                if row is not None and col is not None:
                    w[styles] = w_of[col][styles]
                cells.append(G.synthesis(w[None], noise_mode=noise_mode)[0].cpu())
    blank = -torch.ones_like(next(c for c in cells if c is not None))
    cells = torch.stack([blank if c is None else c for c in cells])
    path = os.path.join(outdir, 'stylemix.png')
    save_image_grid(cells, path, (len(col_seeds) + 1, len(row_seeds) + 1))
    print(f'Wrote {path}')


if __name__ == '__main__':
    main()
