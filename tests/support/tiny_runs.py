"""The tests' tiny training runs: --cfg=tiny, the quick start's networks at width 2 for images of any resolution (added
for a test by the `tiny_preset` fixture of tests/conftest.py), the Experiment of such a run, and two snapshots
compared tensor for tensor."""

from __future__ import annotations

from typing import Any, Iterator

import torch

from torch_utils import persistence
from training.experiment import Experiment


def add_tiny_preset(monkeypatch) -> None:
    """--cfg=tiny in the SN-GAN family's presets, for as long as `monkeypatch` holds."""
    from training.recipes import sngan
    preset = dict(sngan.PRESETS['quickstart'], G_args=dict(ch=2), D_args=dict(ch=2))
    del preset['resolution']
    monkeypatch.setitem(sngan.PRESETS, 'tiny', preset)


def tiny_experiment(data: str, steps: int, batch: int, **options) -> Experiment:
    """A width-2 quickstart run on `data` (needs the tiny_preset fixture)."""
    from training.data.dataset import ImageFolderDataset
    dataset = ImageFolderDataset(path=data)
    return Experiment.build(cfg='tiny', data=data, img_resolution=dataset.resolution, img_channels=dataset.num_channels,
                            batch=batch, steps=steps, **options)


def tensors(value: Any, prefix: str = '') -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in a snapshot (networks' state dicts, optimizer states, random states), by its path in it."""
    if isinstance(value, torch.nn.Module):
        value = value.state_dict()
    if isinstance(value, torch.Tensor):
        yield prefix, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from tensors(item, f'{prefix}.{key}')
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from tensors(item, f'{prefix}[{i}]')


def assert_same_snapshot(path_a, path_b) -> None:
    """The snapshots at the two paths hold the same tensors, bit for bit, and the same progress."""
    a, b = persistence.load_snapshot(str(path_a)), persistence.load_snapshot(str(path_b))
    ta, tb = dict(tensors(dict(a))), dict(tensors(dict(b)))
    assert ta.keys() == tb.keys() and len(ta) > 10
    for key in ta:
        assert ta[key].dtype == tb[key].dtype and torch.equal(ta[key], tb[key]), key
    assert a.progress == b.progress
