"""The GN-GAN authors' training step, timed beside ours: `bench/train_speed.py --authors-code=DIR`.

DIR is a checkout of the authors' repository (github.com/basiclab/GNGAN-PyTorch), which is not part of this
project: its networks (models/resnet.py, dcgan.py, biggan.py), its `normalize_gradient` (models/gradnorm.py)
and its losses (losses.py) are imported from there, as the user asked, and driven by the D step and the G step
of its train.py, restated here:

    D step: zero_grad; z ~ N(0, I), fake labels, fakes = G(z, y) without gradients; one D call on reals and
            fakes concatenated, through normalize_gradient (GN) or plain (no constraint); their loss; backward;
            Adam step; and the four loss values read back to the host for the progress bar, as their loop does
    G step: D's parameters frozen; zero_grad; z, labels; f_hat(G(z, y)); their loss; backward; Adam step

Their moving average and learning-rate schedule are left out, as ours are from bench/train_speed.py's steps.
The networks are theirs for the paper's presets (CIFAR-10 and STL-10 CNN and ResNet, CIFAR-10 BigGAN) with
their config's z_dim, classes and loss; the batches are the preset's (the same as theirs). Their code runs
under the switches of the precision it is compared at (fp32 or tf32: it has no mixed precision).
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import importlib
import os
import statistics
import sys
from typing import Callable

import click
import torch

from bench.common import module_command
from torch_utils import devices

# Preset -> (module, G class, D class, number of classes, loss class) of the authors' repository and configs.
ARCHITECTURES = {
    'cifar10-cnn': ('dcgan', 'Generator32', 'Discriminator32', 1, 'BCEWithLogits'),
    'stl10-cnn': ('dcgan', 'Generator48', 'Discriminator48', 1, 'BCEWithLogits'),
    'cifar10-resnet': ('resnet', 'ResGenerator32', 'ResDiscriminator32', 1, 'HingeLoss'),
    'stl10-resnet': ('resnet', 'ResGenerator48', 'ResDiscriminator48', 1, 'HingeLoss'),
    'cifar10-biggan': ('biggan', 'Generator32', 'Discriminator32', 10, 'HingeLoss'),
}
Z_DIM = 128  # Every config of theirs.
NORMS = ('gn', 'none')
PRECISIONS = ('fp32', 'tf32')


def import_authors_code(path: str) -> tuple[object, object]:
    """(models package loader, losses module) of the authors' checkout at `path`; a one-line error if it is not one."""
    needed = [os.path.join(path, 'models', 'gradnorm.py'), os.path.join(path, 'losses.py')]
    missing = [name for name in needed if not os.path.isfile(name)]
    if missing:
        raise click.ClickException(f'--authors-code: {path} is not a checkout of basiclab/GNGAN-PyTorch '
                                   f'(no {", ".join(os.path.relpath(name, path) for name in missing)})')
    sys.path.insert(0, os.path.abspath(path))
    try:
        return importlib.import_module('models.gradnorm'), importlib.import_module('losses')
    except Exception as e:  # pylint: disable=broad-except  # Their code, whatever it raises on import.
        raise click.ClickException(f'--authors-code: importing {path} failed: {type(e).__name__}: {e}') from None


class AuthorsConfiguration:
    """One (preset, norm, precision) of the authors' code, timed as bench/train_speed.py times ours."""

    def __init__(self, cfg_name: str, norm: str, precision: str, batch_D: int, batch_G: int, n_dis: int,
                 device: torch.device, clock: Callable[[], float], gradnorm, losses) -> None:
        module_name, G_name, D_name, self.n_classes, loss_name = ARCHITECTURES[cfg_name]
        models = importlib.import_module(f'models.{module_name}')
        torch.manual_seed(0)
        self.G = getattr(models, G_name)(Z_DIM, self.n_classes).to(device)
        self.D = getattr(models, D_name)(self.n_classes).to(device)
        self.G_opt = torch.optim.Adam(self.G.parameters(), lr=2e-4, betas=(0.0, 0.9))
        self.D_opt = torch.optim.Adam(self.D.parameters(), lr=2e-4, betas=(0.0, 0.9))
        self.loss_fn = getattr(losses, loss_name)()
        self.normalize_gradient = gradnorm.normalize_gradient if norm == 'gn' else None
        self.cfg, self.norm, self.precision, self.device, self.clock = cfg_name, norm, precision, device, clock
        self.batch_D, self.batch_G, self.n_dis = batch_D, batch_G, n_dis
        self.switches = lambda: devices.run_switches(device, allow_tf32=precision == 'tf32')
        self.times: dict[str, list[float]] = {'D': [], 'G': []}

    def _scores(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.normalize_gradient(self.D, x, y=y) if self.normalize_gradient else self.D(x, y=y)

    def _labels(self, n: int) -> torch.Tensor:
        return torch.randint(self.n_classes, (n,)).to(self.device)

    def discriminator_step(self, x_real: torch.Tensor, y_real: torch.Tensor) -> None:
        self.D_opt.zero_grad()
        with torch.no_grad():
            z = torch.randn(self.batch_D, Z_DIM).to(self.device)
            y_fake = self._labels(self.batch_D)
            x_fake = self.G(z, y_fake).detach()
        scores = self._scores(torch.cat([x_real, x_fake]), torch.cat([y_real, y_fake]))
        real_scores, fake_scores = torch.split(scores, [x_real.shape[0], x_fake.shape[0]])
        loss, loss_real, loss_fake = self.loss_fn(real_scores, fake_scores)
        loss.backward()
        self.D_opt.step()
        for value in (loss, loss_real, loss_fake, torch.tensor(0.0)):  # Their progress bar's reads (cr = 0).
            value.cpu().item()

    def generator_step(self) -> None:
        for p in self.D.parameters():
            p.requires_grad_(False)
        self.G_opt.zero_grad()
        z = torch.randn(self.batch_G, Z_DIM).to(self.device)
        y = self._labels(self.batch_G)
        loss = self.loss_fn(self._scores(self.G(z, y), y))
        loss.backward()
        self.G_opt.step()
        for p in self.D.parameters():
            p.requires_grad_(True)

    def step(self, net: str, record: bool) -> None:
        """One timed D step (on random reals) or G step, as bench/train_speed.Configuration.step times ours."""
        x_real = torch.rand(self.batch_D, 3, *self._image_size(), device=self.device) * 2 - 1
        y_real = self._labels(self.batch_D)
        with self.switches():
            self._sync()
            start = self.clock()
            if net == 'D':
                self.discriminator_step(x_real, y_real)
            else:
                self.generator_step()
            self._sync()
            if record:
                self.times[net].append(self.clock() - start)

    def _image_size(self) -> tuple[int, int]:
        resolution = 48 if self.cfg.startswith('stl10') else 32
        return resolution, resolution

    def _sync(self) -> None:
        if self.device.type == 'cuda':
            torch.cuda.synchronize(self.device)

    def result(self) -> dict:
        d, g = statistics.median(self.times['D']), statistics.median(self.times['G'])
        return dict(cfg=self.cfg, norm=self.norm, precision=self.precision, code='authors', batch_D=self.batch_D,
                    batch_G=self.batch_G, n_dis=self.n_dis, sec_per_D_step=d, sec_per_G_step=g,
                    sec_per_iteration=self.n_dis * d + g, rounds=len(self.times['D']))


def ours_over_authors(rows: list[dict], authors_rows: list[dict]) -> list[dict]:
    """Our time / the authors' for each of our rows that has an authors' row of its preset and norm (at its
    precision, or at tf32 for our bf16/fp16): D step, G step, iteration."""
    out = []
    for row in rows:
        precision = row['precision'] if row['precision'] in PRECISIONS else 'tf32'
        theirs = next((r for r in authors_rows if (r['cfg'], r['norm'], r['precision']) == (row['cfg'], row['norm'], precision)),
                      None)
        if theirs is not None:
            out.append(dict(cfg=row['cfg'], norm=row['norm'], precision=row['precision'], against=precision,
                            cuda_graphs=row['cuda_graphs'], replayed=row['replayed'],
                            D=row['sec_per_D_step'] / theirs['sec_per_D_step'],
                            G=row['sec_per_G_step'] / theirs['sec_per_G_step'],
                            iteration=row['sec_per_iteration'] / theirs['sec_per_iteration']))
    return out


# Not a program: --help shows this module's docstring, and a run names the program to run instead.
main = module_command(__doc__, 'python -m bench.train_speed --authors-code=DIR')

if __name__ == '__main__':
    main()
