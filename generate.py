"""Generate images with a trained network snapshot.

Examples:

\b
  # 64 images of the quick start's (class-conditional) digit 7, one PNG per seed, plus one grid of all of them.
  python generate.py --network=training-runs/00000-digits32-quickstart-gn/network-snapshot-000080.pkl \\
      --seeds=0-63 --grid --class=7 --outdir=out

\b
  # Unconditional network: no --class.
  python generate.py --network=snap.pkl --seeds=0-15 --outdir=out

\b
  # GN-StyleGAN: truncation (of the first 8 style layers, as in StyleGAN), and StyleGAN's
  # style-mixing figure (rows take coarse, middle or fine styles from the columns).
  python generate.py --network=snap.pkl --seeds=0-7 --trunc=0.7 --outdir=out
  python generate.py --network=snap.pkl --mix-rows=888,829,1898,1733,1614,845 --mix-cols=639,701,687,615,2268 --outdir=out

\b
  # A latent walk through seeds 0-7 and back to 0 (30 frames between two seeds); .mp4 needs imageio-ffmpeg.
  python generate.py --network=snap.pkl --seeds=0-7 --video=out/walk.gif --outdir=out

--mix-styles takes coarse (layers 0-3), middle (4-7), fine (8-) or a list such as 0-3; by default
the rows are split 3:2:1 into coarse, middle and fine, as in StyleGAN's figure, whose noise is const.
With random noise, StyleGAN's images are made one at a time, each depending on its seed only.
StyleGAN2 generators (gn-stylegan2, NVIDIA's pickles) default to NVIDIA's generate.py: const noise,
truncation of every style layer, so that a seed gives the image their tool gives.
"""

from __future__ import annotations

import math
import os
import shutil

from torch_utils.threads import set_threads, set_wait_policy

set_wait_policy()  # Before torch is imported (torch_utils/threads.py).

from torch_utils.compat import require_supported_torch  # noqa: E402

require_supported_torch()  # One line on a torch older than the oldest supported, before any work.

import click  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import dnnlib  # noqa: E402
import legacy  # noqa: E402
from torch_utils import devices, misc, persistence  # noqa: E402

MAX_SEED = 2 ** 32 - 1            # np.random.RandomState takes seeds in [0, 2^32).

# StyleGAN's style groups (the paper's section 3.1; NVlabs/stylegan generate_figures.py, figure 3):
# coarse = styles of 4x4 and 8x8 (layers 0-3), middle = 16x16 and 32x32 (4-7), fine = 64x64 and up (8-).
# Its figure gives 3 rows coarse, 2 middle and 1 fine styles from the column seed.
STYLE_GROUPS = {'coarse': (0, 4), 'middle': (4, 8), 'fine': (8, None)}
V1_ROW_WEIGHTS = {'coarse': 3, 'middle': 2, 'fine': 1}

#----------------------------------------------------------------------------


def _load_generator(network: str, device: torch.device, cfg: str | None = None) -> torch.nn.Module:
    try:
        snapshot = legacy.load_network(network, cfg)
    except (OSError, persistence.UnsafeSnapshotError, legacy.OfficialCheckpointError) as e:
        raise click.ClickException(f'--network: {e}')
    G = snapshot.get('G_ema', snapshot.get('G'))
    if G is None or not hasattr(G, 'z_dim') or not hasattr(G, 'c_dim'):
        raise click.ClickException(f'--network: {network} holds no generator')
    bad = misc.find_nonfinite(G)
    if bad is not None:
        raise click.ClickException(f'--network: {network} has non-finite weights ({bad} holds NaN or Inf); '
                                   f'the run diverged before this snapshot')
    return G.to(device)


def _parse_seeds(text: str, option: str) -> list[int]:
    try:
        seeds = dnnlib.util.parse_int_list(text)
    except ValueError as e:
        raise click.ClickException(f'{option}: {e}')
    if not seeds:
        raise click.ClickException(f'{option}: no seeds given')
    bad = next((s for s in seeds if not 0 <= s <= MAX_SEED), None)
    if bad is not None:
        raise click.ClickException(f'{option}: seed {bad} is outside 0..{MAX_SEED}')
    return seeds


def _device(name: str | None) -> torch.device:
    """The --device to generate on, refused in one line if torch cannot use it."""
    try:
        return devices.parse_device(name)
    except ValueError as e:
        raise click.ClickException(f'--device: {e}')


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


def _style_ranges(spec: str | None, num_rows: int, num_ws: int) -> list[list[int]]:
    """The style layers each row of the mixing figure takes from the column seed.

    spec: None = StyleGAN's figure (rows split 3:2:1 into coarse, middle and fine, among the groups
    this network has); a group name for every row; or a layer list such as '0-3'.
    """
    groups = {name: list(range(lo, num_ws if hi is None else min(hi, num_ws))) for name, (lo, hi) in STYLE_GROUPS.items()}
    if spec is None:
        weights = [(name, w) for name, w in V1_ROW_WEIGHTS.items() if groups[name]]
        total = sum(w for _, w in weights)
        rows = []
        for row in range(num_rows):
            # Row r takes the group whose share of [0, 1) holds the row's centre (r + 1/2) / R.
            cum = 0
            for name, w in weights:
                cum += w
                if (2 * row + 1) * total < 2 * num_rows * cum:
                    rows.append(groups[name])
                    break
        return rows
    if spec in groups:
        if not groups[spec]:
            raise click.ClickException(f'--mix-styles={spec}: this network has only {num_ws} style layers, none of them {spec}')
        return [groups[spec]] * num_rows
    try:
        layers = dnnlib.util.parse_int_list(spec)
    except ValueError as e:
        raise click.ClickException(f'--mix-styles: {e}')
    if not layers or any(not 0 <= s < num_ws for s in layers):
        raise click.ClickException(f'--mix-styles must lie in 0..{num_ws - 1} (or be coarse, middle, fine)')
    return [layers] * num_rows

#----------------------------------------------------------------------------


@click.command(help=__doc__)
@click.option('--network', 'network',                 help='Network snapshot or NVIDIA StyleGAN2 pickle: path or URL', metavar='PKL|URL', type=str, required=True, callback=dnnlib.util.expand_user)
@click.option('--cfg',                                help='Preset of an official GN-GAN checkpoint given as --network',               type=click.Choice(legacy.official_cfgs()))
@click.option('--seeds',                              help='Seeds in 0..2^32-1, e.g. 0-63 or 1,5,9', metavar='LIST',                   type=str, default='0-7', show_default=True)
@click.option('--outdir',                             help='Where to write the images', metavar='DIR',                                 type=str, required=True, callback=dnnlib.util.expand_user)
@click.option('--class', 'class_idx',                 help='Class label (conditional networks)', metavar='INT',                        type=click.IntRange(min=0))
@click.option('--grid',                               help='Also write all seeds as one grid.png',                                     is_flag=True)
@click.option('--batch',                              help='Images per forward pass (StyleGAN random noise: 1)', metavar='INT', type=click.IntRange(min=1), default=16, show_default=True)

# StyleGAN networks.
@click.option('--trunc', 'truncation_psi',            help='Truncation psi (1 = off)', metavar='FLOAT',                                type=float, default=1, show_default=True)
@click.option('--trunc-cutoff', 'truncation_cutoff',  help='Truncate only the first N style layers  [default: 8; StyleGAN2: all]', metavar='INT', type=click.IntRange(min=0))
@click.option('--noise-mode',                         help='Per-layer noise  [default: random, seeded by the image\'s seed; StyleGAN2: const]', type=click.Choice(['const', 'random', 'none']))
@click.option('--mix-rows',                           help='Style mixing: seeds of the rows', metavar='SEEDS',                         type=str)
@click.option('--mix-cols',                           help='Style mixing: seeds of the columns', metavar='SEEDS',                      type=str)
@click.option('--mix-styles',                         help='Style mixing: layers taken from the columns  [default: coarse/middle/fine]', metavar='STYLES', type=str)

# Videos and execution.
@click.option('--video',                              help='Also write a latent walk through --seeds (.gif, or .mp4 with imageio-ffmpeg)', metavar='PATH', type=str, callback=dnnlib.util.expand_user)
@click.option('--video-frames',                       help='Video frames from one seed to the next (30 per second)', metavar='INT',   type=click.IntRange(min=1), default=30, show_default=True)
@click.option('--device',                             help='cpu, cuda or cuda:N  [default: cuda if there is a GPU]', metavar='DEVICE', type=str)
@click.option('--threads',                            help='CPU threads  [default: one per core]', metavar='INT',                      type=click.IntRange(min=1))
def main(network: str, cfg: str | None, seeds: str, truncation_psi: float, truncation_cutoff: int | None, class_idx: int | None,
         noise_mode: str | None, grid: bool, mix_rows: str | None, mix_cols: str | None, mix_styles: str | None, outdir: str,
         batch: int, threads: int | None, video: str | None, video_frames: int, device: str | None) -> None:
    # Everything that can be checked is checked before the output directory is made.
    set_threads(threads)
    device = _device(device)
    if not math.isfinite(truncation_psi):
        raise click.ClickException(f'--trunc must be a finite number, not {truncation_psi}')
    if (mix_rows is None) != (mix_cols is None):
        raise click.ClickException('--mix-rows and --mix-cols go together')
    mixing = mix_rows is not None
    if mixing:
        row_seeds, col_seeds = _parse_seeds(mix_rows, '--mix-rows'), _parse_seeds(mix_cols, '--mix-cols')
    else:
        seed_list = _parse_seeds(seeds, '--seeds')
    if os.path.exists(outdir) and not os.path.isdir(outdir):
        raise click.ClickException(f'--outdir: {outdir} exists and is not a directory')
    if video is not None:
        _check_video(video, mixing, [] if mixing else seed_list, outdir)

    G = _load_generator(network, device, cfg)
    is_stylegan = hasattr(G, 'mapping') and hasattr(G, 'synthesis')
    if not is_stylegan and (truncation_psi != 1 or truncation_cutoff is not None or noise_mode is not None or mixing):
        raise click.ClickException('--trunc, --trunc-cutoff, --noise-mode and style mixing need a StyleGAN snapshot')
    if is_stylegan and truncation_cutoff is None and truncation_psi != 1:  # The network's own generation defaults.
        truncation_cutoff = G.default_truncation_cutoff
    trunc = dict(truncation_psi=truncation_psi, truncation_cutoff=truncation_cutoff)
    styles = _style_ranges(mix_styles, len(row_seeds), G.num_ws) if mixing else None
    c = _labels(G, class_idx, 1, device)

    created = not os.path.isdir(outdir)
    try:
        os.makedirs(outdir, exist_ok=True)
        if mixing:
            path = _style_mixing_figure(G, row_seeds, col_seeds, styles, c, trunc, noise_mode or 'const', device, outdir)
            print(f'Wrote {path}')
        else:
            images = _generate(G, seed_list, c, trunc if is_stylegan else {}, (noise_mode or G.default_noise_mode) if is_stylegan
                               else None, batch, device, outdir)
            print(f'Wrote {len(seed_list)} images to {outdir}')
            if grid:
                path = os.path.join(outdir, 'grid.png')
                gw = int(np.ceil(np.sqrt(len(seed_list))))
                gh = int(np.ceil(len(seed_list) / gw))
                images = torch.cat([images, -torch.ones(gw * gh - len(seed_list), *images.shape[1:])])  # Black padding.
                misc.save_image_grid(images, path, (gw, gh))
                print(f'Wrote {path}')
            if video is not None:
                _latent_walk(G, seed_list, c, trunc if is_stylegan else {}, video_frames, device, video)
                print(f'Wrote {video}')
    except OSError as e:
        if created:  # Nothing of a failed run stays in a directory it made.
            shutil.rmtree(outdir, ignore_errors=True)
        raise click.ClickException(f'--outdir: cannot write to {outdir}: {e.strerror or e}')


def _generate(G: torch.nn.Module, seeds: list[int], c: torch.Tensor, trunc: dict, noise_mode: str | None, batch: int,
              device: torch.device, outdir: str) -> torch.Tensor:
    """seed<seed>.png for every seed; returns the images [N, C, H, W] in [-1, 1] on the CPU.

    Random noise is drawn from a generator seeded with the image's seed, one image per pass, so that
    an image depends on its seed only (not on --batch or on the other seeds).
    """
    style = {} if noise_mode is None else dict(trunc, noise_mode=noise_mode)
    chunks = [seeds[i:i + batch] for i in range(0, len(seeds), batch)] if noise_mode != 'random' else [[s] for s in seeds]
    images = []
    with torch.no_grad():
        for chunk in chunks:
            with torch.random.fork_rng(devices=[device] if device.type == 'cuda' else []):
                torch.manual_seed(chunk[0])
                img = G(_z(G, chunk, device), c.expand(len(chunk), -1), **style).cpu()
            for seed, im in zip(chunk, img):
                misc.save_image_grid(im[None], os.path.join(outdir, f'seed{seed:04d}.png'), grid_size=(1, 1))
            images.append(img)
    return torch.cat(images)


def _check_video(path: str, mixing: bool, seeds: list[int], outdir: str) -> None:
    """Refuse, in one line, a --video that cannot be written: style mixing, fewer than two seeds, an unknown
    format, mp4 without its encoder, or a folder that does not exist (other than --outdir, which is made)."""
    if mixing or len(seeds) < 2:
        raise click.ClickException('--video walks through the --seeds: give two or more (and no style mixing)')
    extension = os.path.splitext(path)[1].lower()
    if extension not in ('.gif', '.mp4'):
        raise click.ClickException(f'--video: {path} must end in .gif or .mp4')
    if extension == '.mp4':
        try:
            import imageio_ffmpeg  # noqa: F401  (imageio's mp4 writer)
        except ImportError:
            raise click.ClickException('--video: .mp4 needs imageio-ffmpeg (pip install imageio-ffmpeg); .gif works as installed') from None
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) and folder != os.path.abspath(outdir):
        raise click.ClickException(f'--video: no such folder {folder}')


def slerp(a: torch.Tensor, b: torch.Tensor, t: float) -> torch.Tensor:
    """Spherical interpolation between latents a and b (rows): the direction moves along the great circle,
    (sin((1-t) W) a' + sin(t W) b') / sin W with a', b' the unit directions and W the angle between them, and
    the length linearly from |a| to |b|; linear where a and b are (nearly) parallel."""
    norm_a, norm_b = a.norm(dim=-1, keepdim=True), b.norm(dim=-1, keepdim=True)
    unit_a, unit_b = a / norm_a, b / norm_b
    angle = (unit_a * unit_b).sum(-1, keepdim=True).clamp(-1, 1).acos()
    if float(angle.abs().max()) < 1e-6:
        return torch.lerp(a, b, t)
    direction = (torch.sin((1 - t) * angle) * unit_a + torch.sin(t * angle) * unit_b) / torch.sin(angle)
    return torch.lerp(norm_a, norm_b, t) * direction


def _latent_walk(G: torch.nn.Module, seeds: list[int], c: torch.Tensor, trunc: dict, frames_per_seed: int,
                 device: torch.device, path: str) -> None:
    """Frames of G along great circles between the seeds' latents (in order, then back to the first), 30 fps;
    StyleGAN's noise fixed (const) so that the picture moves only with the latent."""
    import imageio.v2 as imageio
    z = _z(G, seeds + seeds[:1], device)
    style = dict(trunc, noise_mode='const') if trunc else {}
    frames = []
    with torch.no_grad():
        for i in range(len(seeds)):
            for j in range(frames_per_seed):
                img = G(slerp(z[i:i + 1], z[i + 1:i + 2], j / frames_per_seed), c, **style)
                img = (img[0].permute(1, 2, 0) * 127.5 + 128).clamp(0, 255).to(torch.uint8).cpu().numpy()
                frames.append(img.repeat(3, axis=2) if img.shape[2] == 1 else img)
    with dnnlib.util.atomic_path(path, suffix=os.path.splitext(path)[1]) as tmp:
        if path.lower().endswith('.gif'):
            imageio.mimsave(tmp, frames, duration=1000 / 30, loop=0)
        else:
            imageio.mimsave(tmp, frames, fps=30)


def _style_mixing_figure(G: torch.nn.Module, row_seeds: list[int], col_seeds: list[int], styles: list[list[int]],
                         c: torch.Tensor, trunc: dict, noise_mode: str, device: torch.device, outdir: str) -> str:
    """StyleGAN's figure: top row = column seeds, left column = row seeds, cell (r, c) = row seed r with
    the style layers styles[r] taken from column seed c. Writes stylemix.png and returns its path."""
    seeds = list(dict.fromkeys(row_seeds + col_seeds))
    with torch.no_grad():
        ws = G.mapping(_z(G, seeds, device), c.expand(len(seeds), -1), **trunc)
        w_of = dict(zip(seeds, ws))
        cells = []
        for r, row in enumerate([None] + row_seeds):
            for col in [None] + col_seeds:
                if row is None and col is None:
                    cells.append(None)
                    continue
                w = w_of[row if row is not None else col].clone()
                if row is not None and col is not None:
                    w[styles[r - 1]] = w_of[col][styles[r - 1]]
                with torch.random.fork_rng(devices=[device] if device.type == 'cuda' else []):
                    torch.manual_seed(row if row is not None else col)
                    cells.append(G.synthesis(w[None], noise_mode=noise_mode)[0].cpu())
    blank = -torch.ones_like(next(c for c in cells if c is not None))
    cells = torch.stack([blank if c is None else c for c in cells])
    path = os.path.join(outdir, 'stylemix.png')
    misc.save_image_grid(cells, path, (len(col_seeds) + 1, len(row_seeds) + 1))
    return path


if __name__ == '__main__':
    main()
