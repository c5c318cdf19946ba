"""Networks from files: this project's snapshots, the checkpoints of the official GN-GAN code, and StyleGAN2
pickles of NVIDIA's code (read as data by torch_utils/nvidia_pickle.py; docs/nvidia-pickles.md).

The official code (github.com/basiclab/GNGAN-PyTorch) saves `model.pt`, `best_model.pt` and
`<step>.pt` with torch.save: a dict holding the state dicts `net_G`, `ema_G` and `net_D` (plus
optimizer and scheduler states, fixed latents, best IS / FID and the step). Its standard CNN
(models/dcgan.py), ResNets (models/resnet.py, 32 to 256) and BigGAN (models/biggan.py) are the layers
of training/networks/sngan.py and biggan.py under other module names, so such a checkpoint becomes
one of our snapshots (`G` <- net_G, `G_ema` <- ema_G, `D` <- net_D) by renaming its tensors:

\b
* nn.Sequential indices become named layers (e.g. ResNet G `blocks.0.residual.3` -> `blocks.0.conv1`);
* spectral norm (BigGAN G): the old-style `weight_orig` / `weight_u` / `weight_v` of
  torch.nn.utils.spectral_norm become the parametrization's `original` / `0._u` / `0._v`, with the
  same meaning (W / (u^T W v) with the stored u, v in eval mode);
* class embeddings (BigGAN: conditional BN gain / bias in G, projection in D) are nn.Embedding
  weights [classes, C] there and bias-free nn.Linear weights [C, classes] on one-hot labels here,
  so they are transposed (embedding(y) = onehot(y) @ E = Linear with weight E^T);
* train_ddp.py's checkpoints carry DistributedDataParallel's `module.` prefix, which is dropped.

Every tensor of the file must find its place and every tensor of our network must be filled, with
the same shape; anything else is refused with a one-line error. Only tensors and plain containers are
read (`torch.load(weights_only=True)`), plus NumPy scalars (the official code stores its best IS / FID
as numpy.float64), rebuilt from their dtype and bytes, and only from a file that passed
torch_utils/bounded_read.py's archive check (the zip archive of torch >= 1.6, entries uncompressed and
within the file), so that it is read within that module's memory bound.

Usage (a converted snapshot; generate.py and calc_metrics.py also take the checkpoint directly):

\b
  python legacy.py --source=logs/GN-GAN_CIFAR10_RES/best_model.pt --cfg=cifar10-resnet --dest=gngan-official.pkl
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import warnings

import click
import numpy as np
import torch

import dnnlib
from torch_utils import bounded_read, compat, nvidia_pickle, persistence
from training.recipes import configs

#----------------------------------------------------------------------------

_FAMILIES = ('cnn', 'resnet', 'biggan')  # --cfg architectures that the official code has.
_OFFICIAL_NETWORKS = {'net_G': 'G', 'ema_G': 'G_ema', 'net_D': 'D'}  # Official name -> snapshot name.

# Globals a checkpoint may name besides tensors: NumPy scalars, rebuilt from a dtype and raw bytes.
# Pickles made with NumPy 1 name the scalar constructor numpy.core.multiarray.scalar.
_NUMPY_SCALAR_GLOBALS = [np.dtype, np.dtypes.Float64DType, np.dtypes.Float32DType, np.dtypes.Int64DType,
                         np._core.multiarray.scalar,
                         compat.named_global(np._core.multiarray.scalar, 'numpy.core.multiarray.scalar')]

# Parameter names of the old-style torch.nn.utils.spectral_norm -> torch.nn.utils.parametrizations.spectral_norm.
_SPECTRAL_NORM_NAMES = {'weight_orig': 'parametrizations.weight.original', 'weight_u': 'parametrizations.weight.0._u',
                        'weight_v': 'parametrizations.weight.0._v'}


class OfficialCheckpointError(ValueError):
    """The file is not an official GN-GAN checkpoint of the given --cfg; the message is one line."""


def official_cfgs() -> list[str]:
    """The --cfg presets whose networks the official code also has (at the paper's widths)."""
    return [name for name, preset in configs.PRESETS.items() if preset['arch'] in _FAMILIES and 'G_args' not in preset]

#----------------------------------------------------------------------------
# Module names: official -> ours, per family and network. A tensor `<module>.<param>` of the
# official state dict becomes `<our module>.<param>` (spectral-norm params renamed as above).


def _discriminator_modules(num_blocks: int, container: str) -> dict[str, str]:
    """ResNet / BigGAN D: SN-GAN's optimized first block, then DisBlocks; `container` is the official
    nn.Sequential holding them ('model' in models/resnet.py, 'blocks' in models/biggan.py). The
    official first block pools before its 1x1 shortcut conv and ours after it: both are linear, so
    the order does not change the result."""
    modules = {f'{container}.0.residual.0': 'blocks.0.conv1', f'{container}.0.residual.2': 'blocks.0.conv2',
               f'{container}.0.shortcut.1': 'blocks.0.shortcut', 'linear': 'fc'}
    for i in range(1, num_blocks):
        modules.update({f'{container}.{i}.residual.1': f'blocks.{i}.conv1', f'{container}.{i}.residual.3': f'blocks.{i}.conv2',
                        f'{container}.{i}.shortcut.0': f'blocks.{i}.shortcut'})
    return modules


def _module_map(family: str, kind: str, net: torch.nn.Module) -> tuple[dict[str, str], set[str]]:
    """(official module -> our module, official modules that are class embeddings to transpose)."""
    if family == 'cnn' and kind == 'G':
        # main: (BN, ReLU, ConvT) four times, the last ConvT to RGB, then Tanh.
        modules = {'linear': 'fc', f'main.{3 * len(net.convs) + 2}': 'to_rgb'}
        modules.update({f'main.{3 * i}': f'norms.{i}.bn' for i in range(len(net.norms))})
        modules.update({f'main.{3 * i + 2}': f'convs.{i}' for i in range(len(net.convs))})
        return modules, set()
    if family == 'cnn':
        # main: Conv, LeakyReLU, repeated seven times.
        return {'linear': 'fc', **{f'main.{2 * i}': f'convs.{i}' for i in range(len(net.convs))}}, set()
    if family == 'resnet' and kind == 'G':
        # GenBlock residual: BN, ReLU, Upsample, Conv, BN, ReLU, Conv; shortcut: Upsample, Conv.
        modules = {'linear': 'fc', 'output.0': 'norm', 'output.2': 'to_rgb'}
        for i in range(len(net.blocks)):
            modules.update({f'blocks.{i}.residual.0': f'blocks.{i}.norm1.bn', f'blocks.{i}.residual.3': f'blocks.{i}.conv1',
                            f'blocks.{i}.residual.4': f'blocks.{i}.norm2.bn', f'blocks.{i}.residual.6': f'blocks.{i}.conv2',
                            f'blocks.{i}.shortcut.1': f'blocks.{i}.shortcut'})
        return modules, set()
    if family == 'resnet':
        return _discriminator_modules(len(net.blocks), 'model'), set()
    if kind == 'G':
        # GenBlock: bn1 (conditional BN: batchnorm2d + gain / bias embeddings), residual1: ReLU, Upsample,
        # SN-Conv; bn2, residual2: ReLU, SN-Conv; shortcut: Upsample, SN-Conv. Output: BN, ReLU, SN-Conv, Tanh.
        modules = {'linear': 'fc', 'output_layer.0': 'norm', 'output_layer.2': 'to_rgb'}
        embeddings = set()
        for i in range(len(net.blocks)):
            modules.update({f'blocks.{i}.residual1.2': f'blocks.{i}.conv1', f'blocks.{i}.residual2.1': f'blocks.{i}.conv2',
                            f'blocks.{i}.shortcut.1': f'blocks.{i}.shortcut'})
            for n in (1, 2):
                modules.update({f'blocks.{i}.bn{n}.batchnorm2d': f'blocks.{i}.norm{n}.bn',
                                f'blocks.{i}.bn{n}.gain': f'blocks.{i}.norm{n}.gain',
                                f'blocks.{i}.bn{n}.bias': f'blocks.{i}.norm{n}.bias'})
                embeddings |= {f'blocks.{i}.bn{n}.gain', f'blocks.{i}.bn{n}.bias'}
        return modules, embeddings
    modules = dict(_discriminator_modules(len(net.blocks), 'blocks'), embedding='projection.embed')
    return modules, {'embedding'}


def convert_state_dict(state: dict[str, torch.Tensor], family: str, kind: str, net: torch.nn.Module,
                       what: str) -> dict[str, torch.Tensor]:
    """Our state dict for `net` (a `kind` 'G' or 'D' of `family`) from an official one; `what` names
    the source in errors. Raises OfficialCheckpointError unless every tensor maps one to one."""
    if state and all(key.startswith('module.') for key in state):  # DistributedDataParallel.
        state = {key[len('module.'):]: value for key, value in state.items()}
    modules, embeddings = _module_map(family, kind, net)
    ours = net.state_dict()
    converted = {}
    for key, value in state.items():
        module, _, param = key.rpartition('.')
        if module not in modules or not isinstance(value, torch.Tensor):
            raise OfficialCheckpointError(f'{what}: unexpected entry "{key}" for this architecture')
        target = f'{modules[module]}.{_SPECTRAL_NORM_NAMES.get(param, param)}'
        if module in embeddings:
            value = value.t()  # nn.Embedding [classes, C] -> nn.Linear weight [C, classes].
        if target not in ours or target in converted:
            raise OfficialCheckpointError(f'{what}: "{key}" has no place in this architecture')
        if value.shape != ours[target].shape:
            raise OfficialCheckpointError(f'{what}: "{key}" has shape {list(value.shape)}, this architecture '
                                          f'expects {list(ours[target].shape)}')
        converted[target] = value.to(ours[target].dtype).contiguous()
    missing = [key for key in ours if key not in converted]
    if missing:
        raise OfficialCheckpointError(f'{what}: no tensor for {len(missing)} entries of this architecture, e.g. "{missing[0]}"')
    return converted


def _num_classes(checkpoint: dict) -> int:
    """Classes of a BigGAN checkpoint: rows of D's projection embedding or of G's first BN gain embedding."""
    for name, key in [('net_D', 'embedding.weight'), ('net_G', 'blocks.0.bn1.gain.weight'), ('ema_G', 'blocks.0.bn1.gain.weight')]:
        state = checkpoint.get(name) or {}
        for prefix in ('', 'module.'):
            if isinstance(state.get(prefix + key), torch.Tensor):
                return int(state[prefix + key].shape[0])
    raise OfficialCheckpointError('no class embedding found: not a BigGAN checkpoint')


def convert_official_checkpoint(checkpoint: dict, cfg: str, source: str = 'checkpoint') -> dnnlib.EasyDict:
    """Our networks from an official checkpoint dict: EasyDict with G (net_G), G_ema (ema_G), D (net_D),
    each present in the checkpoint, built as the `cfg` preset builds them for 3-channel images at the
    preset's resolution, in eval mode."""
    if cfg not in official_cfgs():
        raise OfficialCheckpointError(f'--cfg={cfg}: the official checkpoints hold one of {", ".join(official_cfgs())}')
    if not _is_official_checkpoint(checkpoint):
        raise OfficialCheckpointError(f'{source}: not an official GN-GAN checkpoint (no {", ".join(_OFFICIAL_NETWORKS)})')
    preset = configs.get_config(cfg)
    family = configs.PRESETS[cfg]['arch']
    c_dim = _num_classes(checkpoint) if family == 'biggan' else 0
    result = dnnlib.EasyDict()
    for name, snapshot_name in _OFFICIAL_NETWORKS.items():
        if not isinstance(checkpoint.get(name), dict):
            continue
        kind = 'D' if name == 'net_D' else 'G'
        net_kwargs = preset.D_kwargs if kind == 'D' else preset.G_kwargs
        net = dnnlib.util.construct_class_by_name(**net_kwargs, c_dim=c_dim, img_resolution=preset.resolution, img_channels=3)
        state = convert_state_dict(checkpoint[name], family, kind, net, what=f'{source}: {name} as --cfg={cfg}')
        net.load_state_dict(state)
        result[snapshot_name] = net.eval().requires_grad_(False)
    return result


def _read_checkpoint(path_or_url: str) -> object:
    """torch.load of tensors, plain containers and NumPy scalars only; anything else is refused unrun. The file
    must first pass bounded_read's archive check (the zip that torch.save writes, entries stored and within
    the file), so that it is read within its bound."""
    with dnnlib.util.open_url(path_or_url, verbose=False) as f:
        try:
            bounded_read.check_torch_archive(f, path_or_url)
        except bounded_read.RefusedFileError as e:
            raise OfficialCheckpointError(f'{e}; nothing in it was run') from None
        try:
            with warnings.catch_warnings(), torch.serialization.safe_globals(_NUMPY_SCALAR_GLOBALS):
                warnings.simplefilter('ignore')  # torch warns about storages of old files.
                return torch.load(f, map_location='cpu', weights_only=True)
        except Exception as e:  # noqa: BLE001 - arbitrary bytes can fail the unpickler in any way; nothing ran.
            raise OfficialCheckpointError(f'{path_or_url}: refused to load: not a checkpoint of tensors and plain data '
                                          f'({persistence._unpickler_reason(e)}); nothing in it was run') from None


def _is_official_checkpoint(checkpoint: object) -> bool:
    return isinstance(checkpoint, dict) and any(isinstance(checkpoint.get(name), dict) for name in _OFFICIAL_NETWORKS)


def load_official_checkpoint(path_or_url: str, cfg: str) -> dnnlib.EasyDict:
    """Read an official checkpoint (tensors and plain data only) and convert it for `cfg`."""
    return convert_official_checkpoint(_read_checkpoint(path_or_url), cfg, source=path_or_url)


def load_network(path_or_url: str, cfg: str | None = None) -> dnnlib.EasyDict:
    """A snapshot of this project, a StyleGAN2 pickle of NVIDIA's code read as data (torch_utils/nvidia_pickle.py),
    or with `cfg` an official GN-GAN checkpoint converted to one. Raises persistence.UnsafeSnapshotError (of which
    nvidia_pickle.NvidiaPickleError is one), OfficialCheckpointError or OSError with a one-line message."""
    if cfg is not None:
        return load_official_checkpoint(path_or_url, cfg)
    with dnnlib.util.open_url(path_or_url, verbose=False) as f:
        if nvidia_pickle.is_pickle(f):  # Ours and the official checkpoints are zip archives.
            return nvidia_pickle.load_network_pickle(f, path_or_url)
    try:
        return persistence.load_snapshot(path_or_url)
    except persistence.UnsafeSnapshotError as e:
        try:  # _read_checkpoint reads only what passes the same archive check as the snapshot did.
            official = _is_official_checkpoint(_read_checkpoint(path_or_url))
        except (OfficialCheckpointError, OSError):  # Only a hint: a file it cannot read is no official checkpoint.
            official = False
        if official:
            raise OfficialCheckpointError(f'{path_or_url} is a checkpoint of the official GN-GAN code: give its '
                                          f'--cfg ({", ".join(official_cfgs())})') from None
        raise e

#----------------------------------------------------------------------------


@click.command(help=__doc__)
@click.option('--source', help='Official checkpoint (model.pt, best_model.pt): path or URL', metavar='PT', required=True)
@click.option('--cfg',    help='The preset of its networks', type=click.Choice(official_cfgs()), required=True)
@click.option('--dest',   help='Snapshot to write', metavar='PKL', required=True)
def main(source: str, cfg: str, dest: str) -> None:
    try:
        networks = load_official_checkpoint(source, cfg)
    except (OfficialCheckpointError, OSError) as e:
        raise click.ClickException(str(e))
    persistence.save_snapshot(dest, dict(networks))
    print(f'Wrote {", ".join(networks)} to {dest}')


if __name__ == '__main__':
    main()
