"""CR augmentations: flip + translation with black fill, per sample, batched; checked against numpy."""

import numpy as np
import pytest
import torch

from training.step.augment import consistency_augment, draw_shifts, flip_translate


def reference_flip_translate(img, flip, dy, dx, fill):
    """One image [C, H, W] in numpy: optional left-right mirror, then shift by (dy, dx) with constant fill."""
    img = img[:, :, ::-1] if flip else img
    C, H, W = img.shape
    out = np.full_like(img, fill)
    ys, xs = slice(max(dy, 0), H + min(dy, 0)), slice(max(dx, 0), W + min(dx, 0))
    yd, xd = slice(max(-dy, 0), H + min(-dy, 0)), slice(max(-dx, 0), W + min(-dx, 0))
    out[:, ys, xs] = img[:, yd, xd]
    return out


def test_flip_translate_matches_reference():
    rng = np.random.default_rng(0)
    images = rng.uniform(-1, 1, size=(6, 3, 7, 9))
    flip = np.array([False, True, False, True, True, False])
    shift = np.array([[0, 0], [1, -2], [-3, 4], [6, 0], [0, -8], [-7, 9]])  # Includes shifts past the border.
    out = flip_translate(torch.tensor(images), torch.tensor(flip), torch.tensor(shift), fill=-1.0).numpy()
    for i in range(len(images)):
        np.testing.assert_array_equal(out[i], reference_flip_translate(images[i], flip[i], *shift[i], -1.0))


def _recover(original, augmented, limit):
    """All (flip, dy, dx) with |dy|, |dx| <= limit that map `original` to `augmented` exactly."""
    return [(flip, dy, dx)
            for flip in (False, True) for dy in range(-limit, limit + 1) for dx in range(-limit, limit + 1)
            if np.array_equal(reference_flip_translate(original, flip, dy, dx, -1.0), augmented)]


def test_consistency_augment_shape_range_and_parameters():
    torch.manual_seed(0)
    images = torch.rand(64, 3, 10, 10) * 1.8 - 0.9  # Distinct values in (-1, 1): the transform is identifiable.
    out = consistency_augment(images)
    assert out.shape == images.shape and out.dtype == images.dtype
    assert out.min() >= -1 and out.max() <= 1
    params = [_recover(images[i].numpy(), out[i].numpy(), limit=2) for i in range(len(images))]
    assert all(len(p) == 1 for p in params)  # Every output is the input flipped and shifted by at most 20%.
    flips = [p[0][0] for p in params]
    shifts = {p[0][1:] for p in params}
    assert 0.25 < np.mean(flips) < 0.75
    assert {dy for dy, _ in shifts} == {-2, -1, 0, 1, 2} and {dx for _, dx in shifts} == {-2, -1, 0, 1, 2}


def test_consistency_augment_is_per_sample_and_keeps_input():
    torch.manual_seed(1)
    images = torch.rand(1, 3, 16, 16).repeat(32, 1, 1, 1)
    before = images.clone()
    out = consistency_augment(images)
    assert torch.equal(images, before)
    assert len({tuple(o.flatten().tolist()) for o in out}) > 8  # Identical inputs get different augmentations.


@pytest.mark.parametrize('size', [32, 48])
def test_shifts_follow_the_authors_rounding_of_a_uniform_draw(size):
    # torchvision's RandomAffine(translate=(0.2, 0.2)) draws round(u), u ~ U[-0.2 size, 0.2 size]: shift k has the
    # probability of the part of [-m, m] that rounds to k, |[k - 1/2, k + 1/2] & [-m, m]| / (2m).
    m = 0.2 * size
    top = int(np.floor(m + 0.5))
    expected = {k: (min(k + 0.5, m) - max(k - 0.5, -m)) / (2 * m) for k in range(-top, top + 1)}
    torch.manual_seed(0)
    shifts = draw_shifts(200_000, size, size).numpy()
    for axis in range(2):
        values, counts = np.unique(shifts[:, axis], return_counts=True)
        assert set(values.tolist()) == set(expected)  # +-10 at 48x48, +-6 at 32x32.
        for k, count in zip(values.tolist(), counts):
            assert abs(count / len(shifts) - expected[k]) < 5 * np.sqrt(expected[k] / len(shifts)) + 1e-4, (axis, k)


def _decode_flips_and_shifts(out: torch.Tensor, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(flip [N], shift [N, 2]) of consistency_augment's outputs of an image whose pixel (r, c) holds r * W + c + 1
    (the fill is -1): the brightest visible pixel (y, x) is some (r, c) of the source, the sign of the values' step
    along x tells the flip, and then dy = y - r, dx = x - c (c = W - 1 - (x - dx) when flipped)."""
    values = out[:, 0]
    inside = values >= 1
    steps = (values[:, :, 1:] - values[:, :, :-1]) * (inside[:, :, 1:] & inside[:, :, :-1])
    flip = steps.sum(dim=(1, 2)) < 0
    best, index = values.flatten(1).max(dim=1)
    y, x = index // width, index % width
    r, c = (best.long() - 1) // width, (best.long() - 1) % width
    dx = torch.where(flip, c - (width - 1 - x), x - c)
    return flip.numpy(), torch.stack([y - r, dx], dim=1).numpy()


@pytest.mark.parametrize('height,width', [(32, 32), (48, 48), (32, 48)])
def test_the_losss_draw_flips_half_and_shifts_each_axis_within_a_fifth_of_its_size(height, width):
    """consistency_augment, the call the loss makes: flips with probability 1/2, and shifts dy by
    round(U[-0.2 H, 0.2 H]) and dx by round(U[-0.2 W, 0.2 W]) (non-square: each axis its own size), decoded
    from the augmented images."""
    n = 6000
    image = (torch.arange(height * width, dtype=torch.float32) + 1).reshape(1, 1, height, width)
    torch.manual_seed(0)
    flip, shift = _decode_flips_and_shifts(consistency_augment(image.expand(n, 1, height, width)), width)
    assert abs(flip.mean() - 0.5) < 5 * np.sqrt(0.25 / n)
    for axis, size in enumerate((height, width)):
        m = 0.2 * size
        top = int(np.floor(m + 0.5))
        expected = {k: (min(k + 0.5, m) - max(k - 0.5, -m)) / (2 * m) for k in range(-top, top + 1)}
        values, counts = np.unique(shift[:, axis], return_counts=True)
        assert set(values.tolist()) == set(expected), (axis, values)
        for k, count in zip(values.tolist(), counts):
            assert abs(count / n - expected[k]) < 5 * np.sqrt(expected[k] / n) + 1e-4, (axis, k)
