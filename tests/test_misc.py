"""torch_utils.misc: shape assertions, seeding, parameter copies."""

import numpy as np
import PIL.Image
import pytest
import torch

from torch_utils import misc


def test_assert_shape():
    misc.assert_shape(torch.zeros(2, 3, 4), [2, None, 4])
    with pytest.raises(AssertionError, match='dimension 1'):
        misc.assert_shape(torch.zeros(2, 3, 4), [2, 5, 4])
    with pytest.raises(AssertionError, match='number of dimensions'):
        misc.assert_shape(torch.zeros(2, 3), [2, 3, 1])


def test_set_seed_reproducible():
    misc.set_seed(123)
    a = torch.randn(5)
    misc.set_seed(123)
    assert torch.equal(a, torch.randn(5))


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
