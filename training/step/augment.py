"""Augmentations of consistency regularization (CR; Zhang et al., ICLR 2020), batched on the device.

CR penalizes the change of the discriminator output under a semantics-preserving augmentation of
a real image. As in the GN-GAN authors' release (torchvision's RandomHorizontalFlip followed by
RandomAffine(translate=(0.2, 0.2))), an augmentation is a random horizontal flip with probability
1/2 followed by a random integer translation, the shift rounded from a uniform draw within 20% of
the width and of the height (the paper's CR table: pixel shifting by 0.2 x the image size). The
pixels uncovered by the shift are filled with black (-1 in the [-1, 1] image range), which is what
that release does (it fills with 0 in the [0, 1] range); reflection would copy structure into
the border and create content the real image does not have.

Everything is drawn and applied for the whole batch at once with tensor indexing: no Python loop
over images and no round trip through the CPU.
"""

from __future__ import annotations

import torch

#----------------------------------------------------------------------------


def flip_translate(images: torch.Tensor, flip: torch.Tensor, shift: torch.Tensor, fill: float = -1.0) -> torch.Tensor:
    """Flip and translate each image of the batch by its own amount.

    images: [N, C, H, W]. flip: [N] bool, mirror left-right first. shift: [N, 2] integer (dy, dx):
    output[n, :, y, x] = flipped[n, :, y - dy, x - dx], or `fill` where that lies outside the image.
    """
    N, _, H, W = images.shape
    images = torch.where(flip.reshape(N, 1, 1, 1), images.flip(3), images)
    rows = torch.arange(H, device=images.device).reshape(1, H, 1) - shift[:, 0].reshape(N, 1, 1)  # [N, H, 1]
    cols = torch.arange(W, device=images.device).reshape(1, 1, W) - shift[:, 1].reshape(N, 1, 1)  # [N, 1, W]
    inside = ((rows >= 0) & (rows < H) & (cols >= 0) & (cols < W)).unsqueeze(1)                 # [N, 1, H, W]
    batch = torch.arange(N, device=images.device).reshape(N, 1, 1)
    moved = images[batch, :, rows.clamp(0, H - 1), cols.clamp(0, W - 1)]  # Advanced indexing puts C last: [N, H, W, C].
    return torch.where(inside, moved.permute(0, 3, 1, 2), torch.full_like(images, fill))


def draw_shifts(num: int, height: int, width: int, max_translation: float = 0.2,
                device: torch.device | None = None) -> torch.Tensor:
    """Random integer shifts [num, 2] (dy, dx) as torchvision's RandomAffine(translate=(t, t)) draws them.

    Each is round(u), u uniform in [-t * size, t * size] (round half to even, as Python's round): at 48x48
    and t = 0.2 the shifts reach +-10 pixels, the outermost with probability (9.6 - 9.5) / 19.2 each,
    the others 1 / 19.2; at 32x32 they reach +-6, the outermost with probability 0.9 / 12.8 each.
    """
    u = torch.rand(num, 2, device=device) * 2 - 1
    limits = [max_translation * height, max_translation * width]  # Python numbers: no host-to-device copy, no sync.
    return torch.stack([torch.round(u[:, i] * limit) for i, limit in enumerate(limits)], dim=1).long()


def consistency_augment(images: torch.Tensor, max_translation: float = 0.2, fill: float = -1.0) -> torch.Tensor:
    """CR augmentation of a batch: random horizontal flip (p = 1/2), then a random translation.

    Each sample gets its own flip and its own integer shifts dy, dx (draw_shifts: the distribution of the
    authors' torchvision pipeline) for its height and width.
    """
    N, _, H, W = images.shape
    flip = torch.rand(N, device=images.device) < 0.5
    shift = draw_shifts(N, H, W, max_translation, images.device)
    return flip_translate(images, flip, shift, fill)
