"""training/data/data_stream.py: data sharding, batch assembly, reals as D sees them, labels of fakes."""

import itertools

import numpy as np
import pytest
import torch

from bench.graph_emulator import count_syncs, emulate_pinned_memory
from training.data.data_stream import InfiniteSampler, LabelSampler, RealImageStream, process_reals, random_xflip


def test_infinite_sampler_shards_are_disjoint_and_cover_each_pass():
    size, replicas = 10, 2
    shards = [list(itertools.islice(iter(InfiniteSampler(size, rank=r, num_replicas=replicas, seed=3)), 5))
              for r in range(replicas)]
    assert set(shards[0]).isdisjoint(shards[1])
    assert sorted(shards[0] + shards[1]) == list(range(size))  # One full pass over the data.


def test_infinite_sampler_started_later_continues_the_stream():
    whole = list(itertools.islice(iter(InfiniteSampler(7, seed=1)), 30))
    assert list(itertools.islice(iter(InfiniteSampler(7, seed=1, start=16)), 14)) == whole[16:]


def test_random_xflip_flips_whole_images():
    torch.manual_seed(0)
    img = torch.arange(2 * 1 * 3 * 4, dtype=torch.float32).reshape(2, 1, 3, 4).repeat(50, 1, 1, 1)
    out = random_xflip(img)
    flipped = (out == img.flip(3)).flatten(1).all(1)
    same = (out == img).flatten(1).all(1)
    assert torch.all(flipped | same) and 20 < flipped.sum() < 80


class _ToyDataset(torch.utils.data.Dataset):
    """Image i is filled with the value i (uint8) but for its last column, 255 - i (a mirror changes it); its label
    is one-hot i % 3."""
    label_dim = 3

    def __init__(self, size=7, resolution=2):
        self.size, self.resolution = size, resolution

    def __len__(self):
        return self.size

    def get_label(self, idx):
        return np.eye(3, dtype=np.float32)[idx % 3]

    def __getitem__(self, idx):
        img = np.full([1, self.resolution, self.resolution], idx, dtype=np.uint8)
        img[:, :, -1] = 255 - idx
        return img, self.get_label(idx)


def _stream(dataset=None, **kwargs):
    args = dict(chunk=3, rank=0, num_replicas=1, seed=0, device=torch.device('cpu'), num_workers=0) | kwargs
    return RealImageStream(_ToyDataset() if dataset is None else dataset, **args)


def test_real_image_stream_assembles_any_batch_size():
    stream = _stream()
    seen = []
    for batch in (5, 2, 7):
        img, c = stream.next(batch)
        assert img.shape == (batch, 1, 2, 2) and c.shape == (batch, 3)
        values = [int(round((v + 1) * 127.5)) for v in img[:, 0, 0, 0].tolist()]
        assert [int(k) for k in c.argmax(1)] == [v % 3 for v in values]  # Each image keeps its label.
        seen += values
    assert sorted(seen[:7]) == list(range(7)) and sorted(seen[7:]) == list(range(7))  # Two full passes.
    assert stream.consumed == 14


def test_real_image_stream_resumed_at_its_position():
    first = _stream()
    for batch in (4, 5):
        first.next(batch)
    later = _stream(consumed=first.consumed)
    assert torch.equal(later.next(6)[0], first.next(6)[0])


def test_real_image_streams_of_two_processes_see_different_images():
    streams = [_stream(chunk=2, rank=r, num_replicas=2, seed=5) for r in range(2)]
    seen = [{int(round((v + 1) * 127.5)) for v in s.next(3)[0][:, 0, 0, 0].tolist()} for s in streams]
    assert seen[0].isdisjoint(seen[1]) and len(seen[0] | seen[1]) == 6


def test_real_image_stream_at_a_lod_and_flipped():
    dataset = _ToyDataset(size=4, resolution=16)
    raw = _stream(dataset, chunk=4).next(4)[0]
    torch.manual_seed(1)
    img, _ = _stream(dataset, chunk=4, xflip=True, max_resolution=16).next(4, lod=0.5)
    torch.manual_seed(1)  # The same flips, drawn after the lod processing.
    assert torch.equal(img, random_xflip(process_reals(raw, 0.5, 16)))
    flipped = [not torch.equal(a, b) for a, b in zip(img, process_reals(raw, 0.5, 16))]
    assert img.shape == (4, 1, 16, 16) and 0 < sum(flipped) < 4  # This seed flips some images, not all.


def test_label_sampler_follows_the_label_distribution():
    sampler = LabelSampler(_ToyDataset(size=4), np.random.default_rng(0), torch.device('cpu'))
    labels = sampler.sample(4000)
    # Images 0..3 have classes 0, 1, 2, 0: class 0 is drawn half of the time.
    np.testing.assert_allclose(labels.mean(0).numpy(), [0.5, 0.25, 0.25], atol=0.03)
    assert torch.equal(labels.sum(1), torch.ones(4000))

    class Unlabelled(_ToyDataset):
        label_dim = 0
    assert LabelSampler(Unlabelled(), np.random.default_rng(0), torch.device('cpu')).sample(5).shape == (5, 0)


def test_labels_and_reals_reach_a_device_without_the_host_waiting(monkeypatch):
    """Labels of every sampled batch, and reals assembled from several DataLoader chunks (pageable memory, even where
    the loader pins its chunks), are copied to a device asynchronously from pinned memory: a copy from pageable
    memory, or a blocking one, waits for the GPU (bench/graph_emulator: pinned memory emulated, 'meta' as the
    device)."""
    emulate_pinned_memory(monkeypatch)
    device = torch.device('meta')
    sampler = LabelSampler(_ToyDataset(size=4), np.random.default_rng(0), device)
    assert count_syncs(lambda: sampler.sample(8)) == 0
    stream = _stream(_ToyDataset(size=8), chunk=2, device=device)
    assert count_syncs(lambda: stream.next(4)) == 0
    # What the watch counts: a copy of the same labels from pageable memory.
    assert count_syncs(lambda: torch.zeros(8, 3).to(device)) == 1

#----------------------------------------------------------------------------
# Reals.


def _box_down(x: np.ndarray, factor: int) -> np.ndarray:
    n, c, h, w = x.shape
    return x.reshape(n, c, h // factor, factor, w // factor, factor).mean(axis=(3, 5))


def test_process_reals_stable_level():
    rng = np.random.default_rng(0)
    x = rng.standard_normal([2, 3, 32, 32])
    out = process_reals(torch.tensor(x), lod=2.0, max_resolution=32)
    assert out.shape == (2, 3, 8, 8)
    # Directly at the loop level: mean over each 4x4 block, written out element by element.
    expected = np.empty([2, 3, 8, 8])
    for i in range(8):
        for j in range(8):
            expected[:, :, i, j] = x[:, :, 4 * i:4 * i + 4, 4 * j:4 * j + 4].mean(axis=(2, 3))
    np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=1e-12)


def test_process_reals_fade_blend():
    rng = np.random.default_rng(1)
    x = rng.standard_normal([2, 3, 64, 64])
    lod = 1.25  # Active resolution 64 / 2 = 32, a quarter of the way from the 32x32 level towards 16x16.
    out = process_reals(torch.tensor(x), lod=lod, max_resolution=64)
    x32 = _box_down(x, 2)
    x16_up = np.kron(_box_down(x32, 2), np.ones([1, 1, 2, 2]))
    expected = 0.75 * x32 + 0.25 * x16_up
    assert out.shape == (2, 3, 32, 32)
    np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=1e-12)


def test_process_reals_capped_run_and_errors():
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64)
    # Dataset at 64 but the run capped at 32: lod 0 means 32x32.
    np.testing.assert_allclose(process_reals(x, 0.0, 32).numpy(), _box_down(x.numpy(), 2), atol=1e-12)
    with pytest.raises(ValueError):
        process_reals(x, 0.0, 128)  # Reals smaller than the active resolution.
    with pytest.raises(ValueError):
        process_reals(x, 5.0, 64)  # lod beyond 4x4.
