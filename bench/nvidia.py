"""training/networks/stylegan2.py against NVIDIA's own StyleGAN2 networks:

    python -m bench.nvidia --nvidia-code=DIR --out=bench-nvidia.json

DIR is a checkout of NVIDIA's StyleGAN2-ADA PyTorch release (github.com/NVlabs/stylegan2-ada-pytorch, whose
networks are training/networks.py) or of their StyleGAN3 repository (github.com/NVlabs/stylegan3, whose StyleGAN2
networks are training/networks_stylegan2.py). Neither is part of this project: their networks are imported from
there, as the user asked, never copied. Their packages have our packages' names (training, torch_utils, dnnlib):
they are imported under those names with ours set aside, kept apart afterwards, and put back in place only while
their constructors run (their persistence looks itself up by name).

For each configuration (resolution, conditional or not, float16 blocks or not) both networks are built with the
same kwargs; every parameter and buffer of theirs is first moved off its initial value (their zero biases, zero
noise strengths and zero w_avg would hide terms) and then loaded into ours with load_state_dict(strict=True).
Printed per output, with the largest difference and the largest magnitude of theirs:

    G const / none / random     images in training mode (modulation not fused), noise_mode const, none, and
                                random with the same generator seed (both draw the noise in the same order)
    G w_avg after 3 calls       the tracked average of w after those three training-mode calls
    G eval truncated            eval mode (modulation fused), truncation psi 0.7 with cutoff 4, const noise
    D                           D(img, c) on random images
    D grad                      the gradient of sum(D(img, c)) with respect to img

On a CPU the float16 blocks compute in float32 in ours (as in their StyleGAN3 copy), and NVIDIA's StyleGAN2-ADA
release would compute them in float16 on the CPU: those configurations are compared with force_fp32=True on
both sides. On CUDA both compute them in float16 with clamping, compared as they run. Their StyleGAN3 copy
needs setuptools' pkg_resources (its ops import it).
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import contextlib
import copy
import importlib
import os
import sys
from types import ModuleType
from typing import Iterator

import click

import torch

import dnnlib
from bench.common import write_json_atomic
from training.networks import stylegan2

PACKAGES = ('training', 'torch_utils', 'dnnlib')  # Top-level packages that theirs and ours both have.
MODULES = {'training/networks.py': 'training.networks',                        # StyleGAN2-ADA
           'training/networks_stylegan2.py': 'training.networks_stylegan2'}    # StyleGAN3


class NvidiaCode:
    """NVIDIA's StyleGAN2 networks module, imported from a checkout beside ours."""

    def __init__(self, path: str) -> None:
        found = [(name, module) for name, module in MODULES.items() if os.path.isfile(os.path.join(path, name))]
        if not found:
            raise click.ClickException(f'--nvidia-code: {path} is not a checkout of NVlabs/stylegan2-ada-pytorch or '
                                       f'NVlabs/stylegan3 (no {" or ".join(MODULES)})')
        self.path = os.path.abspath(path)
        self.module_name = found[0][1]
        self.stylegan3 = self.module_name.endswith('_stylegan2')
        ours = self._take(PACKAGES)
        sys.path.insert(0, self.path)
        try:
            self.networks: ModuleType = importlib.import_module(self.module_name)
        except Exception as e:  # pylint: disable=broad-except  # Their code, whatever it raises on import.
            raise click.ClickException(f'--nvidia-code: importing {self.module_name} from {path} failed: '
                                       f'{type(e).__name__}: {e}') from None
        finally:
            sys.path.remove(self.path)
            self.theirs = self._take(PACKAGES)
            sys.modules.update(ours)

    @staticmethod
    def _take(packages: tuple[str, ...]) -> dict[str, ModuleType]:
        """Remove the modules of `packages` from sys.modules and return them."""
        taken = {name: module for name, module in sys.modules.items() if name.split('.')[0] in packages}
        for name in taken:
            del sys.modules[name]
        return taken

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Their packages under the shared names (ours back afterwards)."""
        ours = self._take(PACKAGES)
        sys.modules.update(self.theirs)
        try:
            yield
        finally:
            self._take(PACKAGES)
            sys.modules.update(ours)

    def generator(self, **kwargs) -> torch.nn.Module:
        """Their Generator for our kwargs (their StyleGAN3 copy takes the synthesis kwargs flat, and defaults
        w_avg_beta, num_fp16_res and conv_clamp otherwise: ours are given explicitly)."""
        kwargs = copy.deepcopy(kwargs)
        if self.stylegan3:
            kwargs.update(dict(num_fp16_res=0, conv_clamp=None), **kwargs.pop('synthesis_kwargs', {}))
            kwargs['mapping_kwargs'] = dict(dict(w_avg_beta=0.995), **kwargs.get('mapping_kwargs', {}))
        with self.active():
            return self.networks.Generator(**kwargs)

    def discriminator(self, **kwargs) -> torch.nn.Module:
        kwargs = {**dict(num_fp16_res=0, conv_clamp=None), **kwargs} if self.stylegan3 else kwargs
        with self.active():
            return self.networks.Discriminator(**kwargs)

#----------------------------------------------------------------------------


def perturb_(net: torch.nn.Module, seed: int) -> None:
    """Move every floating-point parameter and buffer off its initial value (zero biases, noise strengths and w_avg
    would hide terms), by N(0, 0.2^2) each; the [1,3,3,1] filters stay as they are."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in net.state_dict().items():
            if tensor.is_floating_point() and not name.endswith('resample_filter'):
                tensor.add_(0.2 * torch.randn(tensor.shape, generator=generator).to(tensor.device, tensor.dtype))


def max_diff(theirs: torch.Tensor, ours: torch.Tensor) -> dict:
    theirs, ours = theirs.detach().double(), ours.detach().double()
    if theirs.shape != ours.shape:
        raise AssertionError(f'shapes differ: theirs {list(theirs.shape)}, ours {list(ours.shape)}')
    return dict(max_abs_diff=float((theirs - ours).abs().max()), max_abs=float(theirs.abs().max()))


def compare(code: NvidiaCode, resolution: int, c_dim: int, fp16: bool, device: torch.device, batch: int = 4,
            channel_base: int = 512, channel_max: int = 64, seed: int = 0) -> list[dict]:
    """Rows {output, max_abs_diff, max_abs, ...} for one configuration (small networks: channel_base / channel_max)."""
    precision = dict(num_fp16_res=2, conv_clamp=256) if fp16 else {}
    force_fp32 = fp16 and device.type != 'cuda'
    G_kwargs = dict(z_dim=32, c_dim=c_dim, w_dim=32, img_resolution=resolution, img_channels=3,
                    mapping_kwargs=dict(num_layers=2),
                    synthesis_kwargs=dict(channel_base=channel_base, channel_max=channel_max, **precision))
    D_kwargs = dict(c_dim=c_dim, img_resolution=resolution, img_channels=3, channel_base=channel_base,
                    channel_max=channel_max, epilogue_kwargs=dict(mbstd_group_size=2), **precision)
    torch.manual_seed(seed)
    G_theirs, D_theirs = code.generator(**G_kwargs), code.discriminator(**D_kwargs)
    perturb_(G_theirs, seed)
    perturb_(D_theirs, seed + 1)
    G_ours, D_ours = stylegan2.Generator(**G_kwargs), stylegan2.Discriminator(**D_kwargs)
    G_ours.load_state_dict(G_theirs.state_dict(), strict=True)
    D_ours.load_state_dict(D_theirs.state_dict(), strict=True)
    nets = [net.to(device) for net in (G_theirs, G_ours, D_theirs, D_ours)]
    G_theirs, G_ours, D_theirs, D_ours = nets

    generator = torch.Generator(device).manual_seed(seed)
    z = torch.randn([batch, 32], generator=generator, device=device)
    c = torch.eye(max(c_dim, 1), device=device)[torch.randint(max(c_dim, 1), [batch], generator=generator,
                                                              device=device)][:, :c_dim]
    img = torch.randn([batch, 3, resolution, resolution], generator=generator, device=device)
    run_kwargs = dict(force_fp32=True) if force_fp32 else {}
    config = dict(resolution=resolution, c_dim=c_dim, fp16=fp16, computed_in='float32' if not fp16 or force_fp32 else 'float16')
    rows = []

    def add(output: str, theirs: torch.Tensor, ours: torch.Tensor) -> None:
        rows.append(dict(config, output=output, **max_diff(theirs, ours)))

    # Their StyleGAN3 copy updates w_avg only when asked (update_emas) and fuses the modulation by default.
    update_emas = dict(update_emas=True) if code.stylegan3 else {}
    for noise_mode in ('const', 'none', 'random'):  # Training mode: modulation not fused, w_avg updated.
        images = []
        for G, extra in ((G_theirs, update_emas), (G_ours, {})):
            torch.manual_seed(seed + 2)
            images.append(G.train()(z, c, noise_mode=noise_mode, fused_modconv=False, **run_kwargs, **extra))
        add(f'G {noise_mode}', *images)
    add('G w_avg after 3 calls', G_theirs.mapping.w_avg, G_ours.mapping.w_avg)
    images = [G.eval()(z, c, truncation_psi=0.7, truncation_cutoff=4, noise_mode='const', fused_modconv=True, **run_kwargs)
              for G in (G_theirs, G_ours)]
    add('G eval truncated', *images)

    outputs, grads = [], []
    for D in (D_theirs, D_ours):
        x = img.clone().requires_grad_(True)
        out = D(x, c, **run_kwargs)
        outputs.append(out)
        grads.append(torch.autograd.grad(out.sum(), [x])[0])
    add('D', *outputs)
    add('D grad', *grads)
    return rows


CONFIGS = [(32, 0, False), (32, 10, False), (64, 0, False), (64, 10, False), (32, 0, True), (64, 10, True)]


@click.command()
@click.option('--nvidia-code', help='Checkout of NVlabs/stylegan2-ada-pytorch or NVlabs/stylegan3', metavar='DIR',
              required=True, type=str, callback=dnnlib.util.expand_user)
@click.option('--device',      help='Device to compare on', default='cpu', show_default=True)
@click.option('--out',         help='JSON file for the results', metavar='PATH', default='bench-nvidia.json',
              show_default=True)
def main(nvidia_code: str, device: str, out: str) -> None:
    """Largest differences between NVIDIA's StyleGAN2 networks and ours given the same weights."""
    code = NvidiaCode(nvidia_code)
    try:
        device = torch.device(device)
    except RuntimeError as e:
        raise click.ClickException(f'--device: {e}') from None
    rows = []
    print(f'{"res":>4} {"c_dim":>5} {"fp16":>5} {"computed in":>11}  {"output":<22} {"max |diff|":>11} {"max |theirs|":>12}')
    for resolution, c_dim, fp16 in CONFIGS:
        for row in compare(code, resolution, c_dim, fp16, device):
            rows.append(row)
            print(f'{row["resolution"]:>4} {row["c_dim"]:>5} {str(row["fp16"]):>5} {row["computed_in"]:>11}  '
                  f'{row["output"]:<22} {row["max_abs_diff"]:>11.3g} {row["max_abs"]:>12.3g}')
    write_json_atomic(out, dict(nvidia_code=code.module_name, device=str(device), rows=rows))
    print(f'Wrote {out}')


if __name__ == '__main__':
    main()  # pylint: disable=no-value-for-parameter
