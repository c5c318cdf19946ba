"""torch_utils.misc: shape assertions, seeding, parameter copies, image grids, gradient averaging across processes."""

import os
import random

import numpy as np
import PIL.Image
import pytest
import torch

from torch_utils import compat, misc


def test_assert_shape():
    misc.assert_shape(torch.zeros(2, 3, 4), [2, None, 4])
    with pytest.raises(AssertionError, match='dimension 1'):
        misc.assert_shape(torch.zeros(2, 3, 4), [2, 5, 4])
    with pytest.raises(AssertionError, match='number of dimensions'):
        misc.assert_shape(torch.zeros(2, 3), [2, 3, 1])


@pytest.mark.parametrize('seed', [123, 2**32 + 7])
def test_set_seed_seeds_python_numpy_and_torch(seed):
    # Each generator must continue exactly as a fresh one seeded by hand (numpy takes the seed modulo 2^32).
    misc.set_seed(seed)
    drawn = random.random(), np.random.rand(3), torch.randn(3)
    assert drawn[0] == random.Random(seed).random()
    np.testing.assert_array_equal(drawn[1], np.random.RandomState(seed % 2**32).rand(3))
    assert torch.equal(drawn[2], torch.randn(3, generator=torch.Generator().manual_seed(seed)))


def test_copy_params_and_buffers():
    src, dst = torch.nn.BatchNorm1d(4), torch.nn.BatchNorm1d(4)
    with torch.no_grad():
        src.weight.uniform_()
        src.running_mean.uniform_()
    misc.copy_params_and_buffers(src, dst)
    assert torch.equal(src.weight, dst.weight) and torch.equal(src.running_mean, dst.running_mean)
    with pytest.raises(KeyError):
        misc.copy_params_and_buffers(torch.nn.Identity(), dst, require_all=True)


def test_save_image_grid_layout(tmp_path):
    img = torch.zeros(6, 3, 2, 4)
    for i in range(6):
        img[i] = i / 5 * 2 - 1  # Tile i has a constant value.
    path = str(tmp_path / 'grid.png')
    misc.save_image_grid(img, path, grid_size=(3, 2))
    out = np.asarray(PIL.Image.open(path))
    assert out.shape == (4, 12, 3)
    expected = np.clip(np.round(np.arange(6) / 5 * 255), 0, 255)  # (x * 127.5 + 128) truncated, x = i/5*2-1.
    for i in range(6):
        row, col = divmod(i, 3)
        tile = out[row * 2:(row + 1) * 2, col * 4:(col + 1) * 4]
        assert np.all(np.abs(tile.astype(int) - expected[i]) <= 1)


def test_find_nonfinite():
    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 1))
    assert misc.find_nonfinite(net) is None
    with torch.no_grad():
        net[2].bias.fill_(float('inf'))
        net[1].running_var[1] = float('nan')
    # Parameters come first (in registration order), then buffers.
    assert misc.find_nonfinite(net) == '2.bias'
    with torch.no_grad():
        net[2].bias.zero_()
    assert misc.find_nonfinite(net) == '1.running_var'
    assert misc.find_nonfinite(torch.nn.ReLU()) is None


def test_save_image_grid_leaves_no_partial_file(tmp_path, monkeypatch):
    def full_disk(self, fp, *args, **kwargs):
        with open(fp, 'wb') as f:
            f.write(b'\x89PNG partial')
        raise OSError(28, 'No space left on device')
    monkeypatch.setattr(PIL.Image.Image, 'save', full_disk)
    with pytest.raises(OSError, match='No space'):
        misc.save_image_grid(torch.zeros(1, 3, 2, 2), str(tmp_path / 'grid.png'), (1, 1))
    assert list(tmp_path.iterdir()) == []


def _gloo_worker(rank, store, out_dir, data):
    """One of two CPU processes: local gradients of a linear least-squares loss, then the cross-process average."""
    torch.distributed.init_process_group('gloo', init_method=f'file://{store}', rank=rank, world_size=2)
    torch.set_num_threads(1)
    weight = torch.nn.Parameter(torch.tensor(data['weight']))
    bias = torch.nn.Parameter(torch.tensor(data['bias']))
    unused = torch.nn.Parameter(torch.zeros(2))  # No gradient: must be left alone.
    x, y = torch.tensor(data['x'][rank]), torch.tensor(data['y'][rank])
    ((x @ weight.T + bias - y) ** 2).sum().backward()
    misc.all_reduce_mean_grads([weight, unused, bias])
    np.savez(os.path.join(out_dir, f'rank{rank}.npz'), weight=weight.grad.numpy(), bias=bias.grad.numpy(),
             unused_is_none=unused.grad is None)
    if not compat.destroy_process_group():  # As the programs end a group's process (torch < 2.8: gloo may deadlock).
        os._exit(0)


def test_all_reduce_mean_grads_two_gloo_processes(tmp_path):
    rng = np.random.default_rng(0)
    data = dict(weight=rng.standard_normal([3, 4]), bias=rng.standard_normal(3),
                x=rng.standard_normal([2, 5, 4]), y=rng.standard_normal([2, 5, 3]))
    torch.multiprocessing.spawn(_gloo_worker, args=(str(tmp_path / 'store'), str(tmp_path), data), nprocs=2)

    # The loss sum_i ||W x_i + b - y_i||^2 has gradients 2 r^T x (W) and 2 sum_i r_i (b), with r = x W^T + b - y;
    # computed here per process in float64 numpy and averaged over the two processes.
    residuals = [data['x'][k] @ data['weight'].T + data['bias'] - data['y'][k] for k in range(2)]
    mean_weight = np.mean([2 * r.T @ data['x'][k] for k, r in enumerate(residuals)], axis=0)
    mean_bias = np.mean([2 * r.sum(axis=0) for r in residuals], axis=0)
    for rank in range(2):
        result = np.load(tmp_path / f'rank{rank}.npz')
        np.testing.assert_allclose(result['weight'], mean_weight, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(result['bias'], mean_bias, rtol=1e-12, atol=1e-12)
        assert result['unused_is_none']


def test_all_reduce_mean_buffers_averages_running_statistics_only(monkeypatch):
    """BatchNorm's running statistics and a mapping network's w_avg are averaged over processes; StyleGAN's level of
    detail, constant noise and resampling filters are not touched (their version counters stay: a rewrite makes the
    networks read them on the host again, a synchronisation inside a captured step). The other process is emulated:
    its all_reduce adds 3 to every averaged value."""
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 1), torch.nn.BatchNorm2d(2))
    net.register_buffer('w_avg', torch.tensor([1.0, 2.0]))
    net.register_buffer('lod', torch.tensor(1.5, dtype=torch.float64))
    net.register_buffer('noise_const', torch.randn(4, 4))
    net.register_buffer('box_filter', torch.ones(2, 2), persistent=False)
    net[1].running_mean.copy_(torch.tensor([0.5, -0.5]))
    expected = {name: ((b.double() + 3) / 2).float() for name, b in net.named_buffers()
                if name in ('1.running_mean', '1.running_var', 'w_avg')}
    untouched = {name: (b.clone(), b._version) for name, b in net.named_buffers() if name not in expected}
    monkeypatch.setattr(misc, 'world_size', lambda: 2)
    monkeypatch.setattr(torch.distributed, 'all_reduce', lambda t: t.add_(3))
    misc.all_reduce_mean_buffers(net)
    buffers = dict(net.named_buffers())
    for name, value in expected.items():
        assert torch.equal(buffers[name], value), name
    for name, (value, version) in untouched.items():
        assert torch.equal(buffers[name], value) and buffers[name]._version == version, name
