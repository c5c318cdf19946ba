"""The data side of training: an endless, sharded stream of real images, and labels for the fakes.

    InfiniteSampler     indices of a new permutation every pass; process r of R takes every R-th one
    RealImageStream     batches of reals as D sees them: any batch size, the level of detail of
                        progressive growing, random x-flips; continues where a resumed run stopped
    LabelSampler        labels of generated images, from the training set's label distribution
    process_reals       full-resolution reals brought to what D sees at a level of detail (StyleGAN v1)

The position in the stream (`consumed`) and the label generator's state belong to the run state
(training/run/run_state.py), so a resumed run sees the same images and labels as an uninterrupted one.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from torch_utils import misc


#----------------------------------------------------------------------------


class InfiniteSampler(torch.utils.data.Sampler):
    """Endless shuffled stream of dataset indices; process `rank` gets every `num_replicas`-th one.

    Each pass over the data uses a new permutation, so processes see disjoint images within a
    pass and every image is visited once per pass over all processes.
    """

    def __init__(self, dataset_size: int, rank: int = 0, num_replicas: int = 1, seed: int = 0, start: int = 0) -> None:
        if dataset_size <= 0:
            raise ValueError('The dataset is empty')
        self.dataset_size = dataset_size
        self.rank = rank
        self.num_replicas = num_replicas
        self.seed = seed
        self.start = start  # Position in the stream of all processes to start at (a resumed run's).

    def __iter__(self) -> Iterator[int]:
        rng = np.random.default_rng(self.seed)
        position = 0
        for _ in range(self.start // self.dataset_size):  # Skip whole passes: same permutations drawn.
            rng.permutation(self.dataset_size)
            position += self.dataset_size
        while True:
            for idx in rng.permutation(self.dataset_size):
                if position >= self.start and position % self.num_replicas == self.rank:
                    yield int(idx)
                position += 1


class RealImageStream:
    """Batches of real images as D sees them (float in [-1, 1], on the device) and their labels, of any size.

    The DataLoader delivers fixed chunks; a batch of another size (the progressive schedule
    changes it with the resolution) is assembled from as many chunks as it needs. `consumed`
    counts the images handed out; a stream started with `consumed=k` continues the one that had
    handed out k images (every process consumes alike, so the shared sampler position is k * num_replicas).
    `next(batch, lod)` also brings the images to the level of detail of progressive growing and
    mirrors them at random (xflip).
    """

    def __init__(self,
        dataset: Any,                       # Images as uint8 [C, H, W] and labels, indexable.
        chunk: int,                         # Images per DataLoader batch (at most the smallest batch of the run).
        rank: int,                          # This process...
        num_replicas: int,                  # ...of this many, each reading a disjoint part of every pass.
        seed: int,                          # Seed of the order of the images.
        device: torch.device,               # Where the batches go.
        num_workers: int,                   # DataLoader worker processes.
        consumed: int = 0,                  # Images this process had taken before (a resumed run's position).
        xflip: bool = False,                # Mirror each image left-right with probability 1/2.
        max_resolution: int | None = None,  # Progressive growing: the networks' final resolution.
    ) -> None:
        sampler = InfiniteSampler(len(dataset), rank=rank, num_replicas=num_replicas, seed=seed,
                                  start=consumed * num_replicas)
        # Its own generator: starting the loader must not draw from the global RNG that a resume restores.
        loader = torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=chunk, num_workers=num_workers,
                                             generator=torch.Generator().manual_seed(seed),
                                             pin_memory=device.type == 'cuda',
                                             persistent_workers=num_workers > 0, prefetch_factor=2 if num_workers > 0 else None)
        self._iterator = iter(loader)
        self._device = device
        self._img: list[torch.Tensor] = []
        self._c: list[torch.Tensor] = []
        self._count = 0
        self._xflip = xflip
        self._max_resolution = max_resolution
        self.consumed = consumed

    def next(self, batch: int, lod: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The next `batch` images and labels; at level of detail `lod` (progressive growing) if given."""
        img, c = self._next_raw(batch)
        if lod is not None:
            img = process_reals(img, lod, self._max_resolution)
        if self._xflip:
            img = random_xflip(img)
        return img, c

    def _next_raw(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._count == 0:
            img, c = next(self._iterator)
            if img.shape[0] == batch:  # The usual case: one chunk is one batch, nothing to copy.
                self.consumed += batch
                return self._to_device(img, c)
            self._img, self._c, self._count = [img], [c], img.shape[0]
        while self._count < batch:
            img, c = next(self._iterator)
            self._img.append(img)
            self._c.append(c)
            self._count += img.shape[0]
        img, c = torch.cat(self._img), torch.cat(self._c)
        self._img, self._c, self._count = [img[batch:]], [c[batch:]], img.shape[0] - batch
        self.consumed += batch
        return self._to_device(img[:batch], c[:batch])

    def _to_device(self, img: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # A batch assembled from chunks (torch.cat) is in pageable memory even where the DataLoader pins its chunks.
        img = misc.to_device(img, self._device).to(torch.float32) / 127.5 - 1
        return img, misc.to_device(c, self._device)


def random_xflip(img: torch.Tensor) -> torch.Tensor:
    """Mirror each image left-right with probability 1/2 (the paper's flips of real images)."""
    flip = torch.rand(img.shape[0], 1, 1, 1, device=img.device) < 0.5
    return torch.where(flip, img.flip(3), img)


class LabelSampler:
    """Labels for generated images, drawn from the label distribution of the training set with `rng`
    (the run state's, so that a resumed run draws the same labels)."""

    def __init__(self, dataset: Any, rng: np.random.Generator, device: torch.device) -> None:
        self._dataset, self._rng, self._device = dataset, rng, device

    def sample(self, n: int) -> torch.Tensor:
        if self._dataset.label_dim == 0:
            return torch.zeros(n, 0, device=self._device)
        idx = self._rng.integers(len(self._dataset), size=n)
        return misc.to_device(torch.from_numpy(np.stack([self._dataset.get_label(int(i)) for i in idx])), self._device)

#----------------------------------------------------------------------------


def process_reals(img: torch.Tensor, lod: float, max_resolution: int) -> torch.Tensor:
    """Bring a batch of full-resolution reals [N, C, H, W] (float) to what D sees at `lod`.

    StyleGAN v1 fed D with reals at resolution R = max_resolution / 2**floor(lod), each level made
    from the one above by 2x2 box averaging (so R is reached by averaging boxes of H/R pixels), and,
    during a fade-in, cross-faded them with their own 2x2-averaged, nearest-upsampled copy:

        x_R = lerp(x_R, up(down(x_R)), frac(lod))

    This mirrors how the generator's output at that lod is a blend of the new resolution and the
    upsampled previous one. Images larger than max_resolution (a capped run) are averaged down too.
    """
    if img.ndim != 4 or img.shape[2] != img.shape[3] or not img.is_floating_point():
        raise ValueError(f'reals must be a float [N, C, H, W] batch of square images, got {tuple(img.shape)} {img.dtype}')
    size = img.shape[2]
    for what, value in [('max_resolution', max_resolution), ('the image size', size)]:
        if value < 4 or value & (value - 1):
            raise ValueError(f'{what} must be a power of two of at least 4, got {value}')
    if lod < 0 or max_resolution >> math.floor(lod) < 4:
        raise ValueError(f'lod must lie between 0 and log2(max_resolution) - 2, got {lod}')
    target = max_resolution >> math.floor(lod)  # The active resolution.
    if size < target:
        raise ValueError(f'reals of {size}x{size} are smaller than the active resolution {target}x{target}')

    if size > target:
        img = F.avg_pool2d(img, kernel_size=size // target)
    frac = lod - math.floor(lod)
    if frac > 0:
        low = F.avg_pool2d(img, kernel_size=2).repeat_interleave(2, dim=2).repeat_interleave(2, dim=3)
        img = torch.lerp(img, low, frac)
    return img
