"""What the bench scripts share: a preset's networks and training step built as the training loop builds
them, random batches, comma-separated option lists, and JSON results written atomically.

The training step is the loop's own: `TrainingStep` (training/step/training_step.py: `NetworkUpdater.run` on a
`GANLoss`, replayed as a CUDA graph where asked), with the networks, optimizers and loss kwargs of an
`Experiment` (training/experiment.py) and the arithmetic of training/step/precision.py. The bench scripts time or inspect that step on
random data; none of them has a training step of its own. `count_host_work` counts what a step costs the
host: ATen operators dispatched and Python function calls, the same on a CPU as on a GPU.
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import contextlib
import json
import os
import sys
from typing import Callable, NamedTuple

import click
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import dnnlib
from torch_utils import devices, misc
from training.experiment import Experiment
from training.recipes import configs
from training.step.precision import Precision
from training.step.training_step import TrainingStep

#----------------------------------------------------------------------------


def module_command(doc: str, program: str) -> click.Command:
    """The command line of a bench/ module that is part of another program: --help shows the module's docstring,
    and a run says in one line which program to run instead."""
    @click.command(help=doc)
    def main() -> None:
        raise click.ClickException(f'this module is a part of {program}; run that')
    return main


def parse_list(choices: tuple[str, ...]) -> Callable:
    """click callback: a comma-separated list, each item one of `choices`."""
    def callback(ctx: click.Context, param: click.Parameter, value: str) -> list[str]:
        items = [v for v in value.split(',') if v]
        unknown = [v for v in items if v not in choices]
        if unknown or not items:
            raise click.BadParameter(f'expected a comma-separated list of {", ".join(choices)}; got "{value}"')
        return items
    return callback


def pyplot() -> object | None:
    """matplotlib.pyplot on its file backend (Agg), or None where matplotlib is not installed: only the bench programs'
    figures need it, and each writes its numbers first and says in one line what the figure lacks (no_figure)."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def no_figure(figure: str) -> str:
    """The line a bench program prints where pyplot() is None."""
    return f'{figure} not drawn: it needs matplotlib (pip install matplotlib); the numbers are written'


def write_json_atomic(path: str, data: dict) -> None:
    """Write `data` as JSON to `path` through a temporary file, so that no half-written file is left."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with dnnlib.util.atomic_path(path) as tmp, open(tmp, 'w') as f:
        json.dump(data, f, indent=2)
        f.write('\n')

#----------------------------------------------------------------------------


class HostWork(NamedTuple):
    """What one call of a function costs the host, whatever the device."""
    ops: int           # ATen operators dispatched, forward and backward (on a GPU about one kernel launch each).
    python_calls: int  # Python function calls (sys.setprofile 'call' events; C functions not counted).
    syncs: int | None  # Times the host waited for the GPU (CUDA's synchronisation watch); None on a CPU (what would
                       # wait on a GPU is tests/test_updater.py's to find: a CPU optimizer reads its own step counts).


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def count_host_work(fn: Callable[[], object], device: torch.device = torch.device('cpu')) -> HostWork:
    """Call `fn` twice: once counting the ATen ops it dispatches (a TorchDispatchMode, which also sees the backward
    passes run by the autograd engine) and its waits for the device, once counting its Python calls (sys.setprofile);
    apart, so that neither counter's own Python is counted by the other."""
    counter = _OpCounter()
    with counter:
        cuda_syncs = misc.cuda_syncs_of(fn) if device.type == 'cuda' else None
        if cuda_syncs is None:
            fn()
    python_calls = 0

    def profile(_frame, event: str, _arg) -> None:
        nonlocal python_calls
        python_calls += event == 'call'

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(previous)
    return HostWork(ops=counter.ops, python_calls=python_calls, syncs=None if cuda_syncs is None else len(cuda_syncs))


def preset_experiment(cfg_name: str, norm: str = 'gn', resolution: int | None = None, batch: int | None = None,
                      cmax: int | None = None, channels: int = 3, **options) -> Experiment:
    """The Experiment of a preset on synthetic data, as train.py builds it: the preset's resolution (gn-stylegan:
    networks built for `resolution`), 10 classes where the preset is conditional (unless `label_dim` is given), the
    D batch `batch` (gn-stylegan: the minibatch), and any other Experiment `options`."""
    preset = configs.get_config(cfg_name)
    resolution = preset.get('resolution', resolution)
    if resolution is None:
        raise click.ClickException(f'--cfg={cfg_name} has no fixed resolution: pass --resolution')
    if preset.arch == 'stylegan' and batch is None:
        raise click.ClickException(f'--cfg={cfg_name} has no fixed batch: pass --batch')
    try:
        options.setdefault('label_dim', 10 if preset.conditional else 0)
        return Experiment.build(cfg=cfg_name, norm=norm, img_resolution=resolution, img_channels=channels, batch=batch,
                                cmax=cmax, **options)
    except ValueError as e:
        raise click.ClickException(str(e))


def build_network(kwargs: dict, device: torch.device, seed: int = 0) -> torch.nn.Module:
    """A network from its kwargs, in training mode, frozen (the updaters unfreeze it for its own step)."""
    torch.manual_seed(seed)
    return dnnlib.util.construct_class_by_name(**kwargs).train().requires_grad_(False).to(device)


def training_step(G: torch.nn.Module, D: torch.nn.Module, G_opt: torch.optim.Optimizer, D_opt: torch.optim.Optimizer,
                  loss_kwargs: dict, precision: str = 'fp32', group_size: int = 1, cuda_graphs: str = 'off',
                  lay_out: bool = True) -> TrainingStep:
    """The training loop's D and G steps (training/step/training_step.py) for given networks, optimizers (which
    TrainingSteps may share), GANLoss kwargs (class_name included, as an Experiment gives them) and precision;
    replayed as CUDA graphs as `cuda_graphs` says (off by default: the bench scripts that compare steps by value);
    lay_out: the networks' weights in the run's memory format, as the training loop lays them out (False: as built)."""
    if lay_out:
        Precision(precision).lay_out(G, D)
    loss = dnnlib.util.construct_class_by_name(**loss_kwargs, G=G, D=D, precision=Precision(precision))
    return TrainingStep(G, D, G_opt, D_opt, loss, group_size=group_size, cuda_graphs=cuda_graphs)


def step_switches(training: TrainingStep, deterministic: bool = False) -> contextlib.AbstractContextManager:
    """The process-wide switches of a step's precision and device (torch_utils/devices.run_switches), which the
    training loop sets once per run; `deterministic` as train.py --deterministic."""
    return devices.run_switches(training.device, training.loss.precision.allow_tf32, deterministic)


def random_batch(G: torch.nn.Module, n: int, resolution: int, device: torch.device) -> list[torch.Tensor]:
    """[real_img, real_c, gen_z, gen_c]: uniform images in [-1, 1], random one-hot labels (when G is
    conditional), normal latents."""
    def labels() -> torch.Tensor:
        if G.c_dim == 0:
            return torch.zeros([n, 0], device=device)
        return torch.nn.functional.one_hot(torch.randint(G.c_dim, [n], device=device), G.c_dim).float()
    real = torch.rand([n, G.img_channels, resolution, resolution], device=device) * 2 - 1
    return [real, labels(), torch.randn([n, G.z_dim], device=device), labels()]


# Not a program: --help shows this module's docstring, and a run names the programs to run instead.
main = module_command(__doc__, 'the bench programs (python -m bench.train_speed, bench.stylegan, bench.precision)')

if __name__ == '__main__':
    main()
