"""Augmentations of the discriminator's input, batched on the device: CR's, NVIDIA's ADA pipeline and DiffAugment.

Consistency regularization (CR; Zhang et al., ICLR 2020) penalizes the change of the discriminator output under
a semantics-preserving augmentation of a real image. As in the GN-GAN authors' release (torchvision's
RandomHorizontalFlip followed by RandomAffine(translate=(0.2, 0.2))), an augmentation is a random horizontal
flip with probability 1/2 followed by a random integer translation, the shift rounded from a uniform draw within
20% of the width and of the height (the paper's CR table: pixel shifting by 0.2 x the image size). The pixels
uncovered by the shift are filled with black (-1 in the [-1, 1] image range), which is what that release does (it
fills with 0 in the [0, 1] range); reflection would copy structure into the border and create content the real
image does not have.

AugmentPipe is the augmentation of StyleGAN2-ADA (Karras et al., "Training Generative Adversarial Networks with
Limited Data", NeurIPS 2020, appendix B): each of its transformations is applied to each image with probability
p times the transformation's multiplier, p being adjusted by the training loop (ADA) or fixed. It takes the
keywords of NVIDIA's `training/augment.py` (stylegan2-ada-pytorch) with their defaults, and makes the same random
draws in the same order, so that the same torch random state and p give NVIDIA's batch (bench/augment_check.py
measures it against their code). DiffAugment (Zhao et al., NeurIPS 2020) is likewise the authors'
`DiffAugment_pytorch.py`: the same draws, the same batch.

Everything is drawn and applied for the whole batch at once with tensor operations: no Python loop over images,
no Python branching on drawn values and no round trip through a GPU (where NVIDIA reads its padding amounts back
to the host, the pipeline here pads by the largest amount and masks on a GPU; see AugmentPipe).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import scipy.signal
import torch
import torch.nn.functional as F

from ops import conv2d_gradfix, grid_sample_gradfix, upfirdn2d
from torch_utils import persistence

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

#----------------------------------------------------------------------------
# NVIDIA's pipeline (ADA): the named pipelines of their train.py (--augpipe), as AugmentPipe kwargs.

_BLIT = dict(xflip=1, rotate90=1, xint=1)
_GEOM = dict(scale=1, rotate=1, aniso=1, xfrac=1)
_COLOR = dict(brightness=1, contrast=1, lumaflip=1, hue=1, saturation=1)
AUGPIPE_SPECS = {
    'blit':   dict(_BLIT),
    'geom':   dict(_GEOM),
    'color':  dict(_COLOR),
    'filter': dict(imgfilter=1),
    'noise':  dict(noise=1),
    'cutout': dict(cutout=1),
    'bg':     dict(**_BLIT, **_GEOM),
    'bgc':    dict(**_BLIT, **_GEOM, **_COLOR),
    'bgcf':   dict(**_BLIT, **_GEOM, **_COLOR, imgfilter=1),
    'bgcfn':  dict(**_BLIT, **_GEOM, **_COLOR, imgfilter=1, noise=1),
    'bgcfnc': dict(**_BLIT, **_GEOM, **_COLOR, imgfilter=1, noise=1, cutout=1),
}

# Low-pass taps of Daubechies' least-asymmetric wavelets (symlets), as NVIDIA's augment.py lists them:
# sym6 is the interpolation filter of the geometric transformations, sym2 the root of the image-space filter bank.
_SYM2 = [-0.12940952255092145, 0.22414386804185735, 0.836516303737469, 0.48296291314469025]
_SYM6 = [0.015404109327027373, 0.0034907120842174702, -0.11799011114819057, -0.048311742585633, 0.4910559419267466,
         0.787641141030194, 0.3379294217276218, -0.07263752278646252, -0.021060292512300564, 0.04472490177066578,
         0.0017677118642428036, -0.007800708325034148]

_constants: dict[tuple, torch.Tensor] = {}  # (value, device) -> float32 tensor


def _constant(value: float | tuple, device: torch.device) -> torch.Tensor:
    """A float32 constant (a number or nested tuples of numbers) on the device: copied there on the first call
    only, so the pipeline's later calls make no host-to-device copies."""
    key = (value, device)
    if key not in _constants:
        _constants[key] = torch.tensor(value, dtype=torch.float32, device=device)
    return _constants[key]


def _matrix(*rows: Sequence, device: torch.device) -> torch.Tensor:
    """Matrices [*batch, R, C] from R rows of C entries, each a number or a tensor of the shape `batch` (all the
    same); [R, C] when every entry is a number."""
    entries = [e for row in rows for e in row]
    batch = [e.shape for e in entries if isinstance(e, torch.Tensor)]
    if not batch:
        return _constant(tuple(tuple(float(e) for e in row) for row in rows), device)
    entries = [e if isinstance(e, torch.Tensor) else _constant(float(e), device).expand(batch[0]) for e in entries]
    return torch.stack(entries, dim=-1).reshape(*batch[0], len(rows), len(rows[0]))

# Homogeneous 2-D (pixel coordinates x, y) and 3-D (colour r, g, b) transformations; the inverses as NVIDIA's
# code forms them (1 / s, -t, -theta), so that the products round as theirs do.


def _translate2d(tx, ty, device: torch.device) -> torch.Tensor:
    return _matrix([1, 0, tx], [0, 1, ty], [0, 0, 1], device=device)


def _scale2d(sx, sy, device: torch.device) -> torch.Tensor:
    return _matrix([sx, 0, 0], [0, sy, 0], [0, 0, 1], device=device)


def _rotate2d(theta: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Counter-clockwise by theta in a frame with y up (clockwise on the screen, y down)."""
    return _matrix([torch.cos(theta), torch.sin(-theta), 0], [torch.sin(theta), torch.cos(theta), 0], [0, 0, 1],
                   device=device)


def _translate2d_inv(tx, ty, device: torch.device) -> torch.Tensor:
    return _translate2d(-tx, -ty, device)


def _scale2d_inv(sx, sy, device: torch.device) -> torch.Tensor:
    return _scale2d(1 / sx, 1 / sy, device)


def _rotate2d_inv(theta: torch.Tensor, device: torch.device) -> torch.Tensor:
    return _rotate2d(-theta, device)


def _translate3d(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Adds t to each of r, g, b."""
    return _matrix([1, 0, 0, t], [0, 1, 0, t], [0, 0, 1, t], [0, 0, 0, 1], device=device)


def _scale3d(s: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Multiplies each of r, g, b by s."""
    return _matrix([s, 0, 0, 0], [0, s, 0, 0], [0, 0, s, 0], [0, 0, 0, 1], device=device)


def _rotate3d(v: torch.Tensor, theta: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Rotation by theta about the unit axis v (Rodrigues): R = c I + s [v]_x + (1 - c) v v^T."""
    vx, vy, vz = v[0], v[1], v[2]
    s, c = torch.sin(theta), torch.cos(theta)
    cc = 1 - c
    return _matrix([vx * vx * cc + c,      vx * vy * cc - vz * s, vx * vz * cc + vy * s, 0],
                   [vy * vx * cc + vz * s, vy * vy * cc + c,      vy * vz * cc - vx * s, 0],
                   [vz * vx * cc - vy * s, vz * vy * cc + vx * s, vz * vz * cc + c,      0],
                   [0, 0, 0, 1], device=device)


def _then(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    """a @ b, where None is the identity (a product with it is exact, so it is skipped)."""
    return b if a is None else a if b is None else a @ b


def _filter_bank(lowpass: Sequence[float], bands: int = 4) -> np.ndarray:
    """[bands, taps] zero-phase filters that split an image into octaves: row 0 the lowest, row bands-1 the highest.

    With H(z) the orthogonal low-pass and H(-z) its mirror high-pass, lo2 = H(z) H(1/z) / 2 and hi2 = H(-z) H(-1/z) / 2
    are power complementary (lo2 + hi2 = 1). Starting from the identity in row 0, each level stretches every row by
    two (zero insertion) and smooths it with lo2 (so each older band moves an octave down), then adds hi2 to the next
    row: after three levels the rows are the bands [0, 1/8), [1/8, 1/4), [1/4, 1/2), [1/2, 1] of the spectrum,
    summing to the identity filter.
    """
    lo = np.asarray(lowpass)
    hi = lo * (-1) ** np.arange(lo.size)
    lo2 = np.convolve(lo, lo[::-1]) / 2
    hi2 = np.convolve(hi, hi[::-1]) / 2
    bank = np.eye(bands, 1)
    for band in range(1, bands):
        bank = scipy.signal.upfirdn(lo2, bank, up=2, axis=1)
        start = (bank.shape[1] - hi2.size) // 2
        bank[band, start:start + hi2.size] += hi2
    return bank


@persistence.persistent_class
class AugmentPipe(torch.nn.Module):
    """NVIDIA's augmentation pipeline of StyleGAN2-ADA, draw for draw: forward(images [N, C, H, W] in [-1, 1]).

    Each transformation is applied to each image with probability `p` times its multiplier (p a float32 buffer the
    training loop sets); the multipliers and strengths are NVIDIA's keywords with their defaults, every multiplier
    0 (off). In order:
      blit      xflip (mirror left-right), rotate90 (a multiple of 90 degrees), xint (integer translation, uniform
                within +-xint_max of the size);
      geometry  scale (isotropic, log2 normal with scale_std), rotate (uniform within +-rotate_max half turns,
                before and after the anisotropic scaling, each with the probability that makes either of them
                p * rotate), aniso (log2 normal with aniso_std), xfrac (translation, normal with xfrac_std of the size);
      colour    brightness (added, normal with brightness_std), contrast (log2 normal with contrast_std), lumaflip
                (mirror along the luma axis (1, 1, 1)), hue (rotation about the luma axis within +-hue_max half
                turns), saturation (log2 normal with saturation_std): RGB, or L (hue and saturation skipped, the
                rows of the colour matrix averaged);
      filter    imgfilter: each of four octave bands amplified by a log2 normal gain (imgfilter_std) with its own
                probability (times imgfilter_bands[i]), the gains normalized to keep the expected power of a 1/f image;
      noise     additive Gaussian noise with a standard deviation |N(0, noise_std^2)|;
      cutout    a square of cutout_size of the size, centred uniformly, set to 0.

    Blit and geometry are one inverse transform (output pixel -> input pixel) composed from the draws and
    executed once: the image is padded by reflection, upsampled 2x with the sym6 wavelet filter, resampled
    bilinearly at the transformed positions and downsampled again, so the transformations interpolate with little
    aliasing. NVIDIA pads by the least margin that the batch's transforms need, read back to the host. So does the
    pipeline on a CPU, where that read costs no wait: NVIDIA's batch bit for bit, every spec (bench/augment_check.py).
    On a GPU (`host_margin` False) the image is padded by the largest margin it can take (size - 1) and everything
    beyond NVIDIA's margin is set to zero, before and after the upsampling, which is NVIDIA's image inside a zero
    border, with the margin kept on the device; the resampling's positions, normalized over the larger padded image,
    then round differently in float32 (bench/augment_check.py measures it). Colours are one 4x4 matrix per image;
    the filter is a separable per-image convolution. The constants are copied to the device on the first call: a CUDA
    graph captures a later one.

    Differentiable in the images (every step is linear in them for fixed draws: geometry, filter and cutout
    linear, colour and noise adding a constant), with second derivatives through ops/grid_sample_gradfix,
    ops/upfirdn2d and ops/conv2d_gradfix when called inside `conv2d_gradfix.higher_order_gradients()`.
    """

    def __init__(self,
        xflip: float = 0, rotate90: float = 0, xint: float = 0, xint_max: float = 0.125,
        scale: float = 0, rotate: float = 0, aniso: float = 0, xfrac: float = 0, scale_std: float = 0.2,
        rotate_max: float = 1, aniso_std: float = 0.2, xfrac_std: float = 0.125,
        brightness: float = 0, contrast: float = 0, lumaflip: float = 0, hue: float = 0, saturation: float = 0,
        brightness_std: float = 0.2, contrast_std: float = 0.5, hue_max: float = 1, saturation_std: float = 1,
        imgfilter: float = 0, imgfilter_bands: Sequence[float] = (1, 1, 1, 1), imgfilter_std: float = 1,
        noise: float = 0, cutout: float = 0, noise_std: float = 0.1, cutout_size: float = 0.5,
    ) -> None:
        super().__init__()
        self.register_buffer('p', torch.zeros([]))  # Overall probability multiplier, set by the training loop.
        self.host_margin: bool | None = None  # Pad the geometry by NVIDIA's least margin, read back (None: on a CPU).
        self.xflip, self.rotate90, self.xint = float(xflip), float(rotate90), float(xint)
        self.xint_max = float(xint_max)
        self.scale, self.rotate, self.aniso, self.xfrac = float(scale), float(rotate), float(aniso), float(xfrac)
        self.scale_std, self.rotate_max = float(scale_std), float(rotate_max)
        self.aniso_std, self.xfrac_std = float(aniso_std), float(xfrac_std)
        self.brightness, self.contrast, self.lumaflip = float(brightness), float(contrast), float(lumaflip)
        self.hue, self.saturation = float(hue), float(saturation)
        self.brightness_std, self.contrast_std = float(brightness_std), float(contrast_std)
        self.hue_max, self.saturation_std = float(hue_max), float(saturation_std)
        self.imgfilter, self.imgfilter_bands = float(imgfilter), [float(b) for b in imgfilter_bands]
        self.imgfilter_std = float(imgfilter_std)
        self.noise, self.cutout, self.noise_std, self.cutout_size = float(noise), float(cutout), float(noise_std), \
            float(cutout_size)
        self.register_buffer('Hz_geom', upfirdn2d.setup_filter(_SYM6))
        self.register_buffer('Hz_fbank', torch.as_tensor(_filter_bank(_SYM2), dtype=torch.float32))
        if len(self.imgfilter_bands) != self.Hz_fbank.shape[0]:
            raise ValueError(f'AugmentPipe: imgfilter_bands takes {self.Hz_fbank.shape[0]} multipliers, '
                             f'got {len(self.imgfilter_bands)}')

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """The augmented batch, float32 (float64 for float64 images), computed with autocast off: the resampling
        positions need float32's precision, whatever the run's --precision."""
        if images.ndim != 4:
            raise ValueError(f'AugmentPipe: expected images [N, C, H, W], got shape {list(images.shape)}')
        with torch.autocast(images.device.type, enabled=False):
            images = images if images.dtype == torch.float64 else images.float()
            images = self._geometry(images)
            images = self._colour(images)
            if self.imgfilter > 0:
                images = self._filter(images)
            return self._corruptions(images)

    def _geometry(self, images: torch.Tensor) -> torch.Tensor:
        """Blit and general geometry: draw the inverse transform, then execute it (unless nothing is enabled)."""
        N, C, H, W = images.shape
        device, p = images.device, self.p
        rand = lambda *shape: torch.rand(shape, device=device)
        randn = lambda *shape: torch.randn(shape, device=device)
        G_inv = None  # [N, 3, 3]: output pixel -> input pixel, in pixels about the image centre (y down).

        if self.xflip > 0:
            i = torch.floor(rand(N) * 2)
            i = torch.where(rand(N) < self.xflip * p, i, 0.0)
            G_inv = _then(G_inv, _scale2d_inv(1 - 2 * i, 1, device))
        if self.rotate90 > 0:
            i = torch.floor(rand(N) * 4)
            i = torch.where(rand(N) < self.rotate90 * p, i, 0.0)
            G_inv = _then(G_inv, _rotate2d_inv(-np.pi / 2 * i, device))
        if self.xint > 0:
            t = (rand(N, 2) * 2 - 1) * self.xint_max
            t = torch.where(rand(N, 1) < self.xint * p, t, 0.0)
            G_inv = _then(G_inv, _translate2d_inv(torch.round(t[:, 0] * W), torch.round(t[:, 1] * H), device))

        if self.scale > 0:
            s = torch.exp2(randn(N) * self.scale_std)
            s = torch.where(rand(N) < self.scale * p, s, 1.0)
            G_inv = _then(G_inv, _scale2d_inv(s, s, device))
        if self.rotate > 0:
            # Two rotations, around the anisotropic scaling, each with p_rot: 1 - (1 - p_rot)^2 = p * rotate.
            p_rot = 1 - torch.sqrt((1 - self.rotate * p).clamp(0, 1))
            theta = (rand(N) * 2 - 1) * np.pi * self.rotate_max
            theta = torch.where(rand(N) < p_rot, theta, 0.0)
            G_inv = _then(G_inv, _rotate2d_inv(-theta, device))
        if self.aniso > 0:
            s = torch.exp2(randn(N) * self.aniso_std)
            s = torch.where(rand(N) < self.aniso * p, s, 1.0)
            G_inv = _then(G_inv, _scale2d_inv(s, 1 / s, device))
        if self.rotate > 0:
            theta = (rand(N) * 2 - 1) * np.pi * self.rotate_max
            theta = torch.where(rand(N) < p_rot, theta, 0.0)
            G_inv = _then(G_inv, _rotate2d_inv(-theta, device))
        if self.xfrac > 0:
            t = randn(N, 2) * self.xfrac_std
            t = torch.where(rand(N, 1) < self.xfrac * p, t, 0.0)
            G_inv = _then(G_inv, _translate2d_inv(t[:, 0] * W, t[:, 1] * H, device))

        if G_inv is None:
            return images
        return self._resample(images, G_inv)

    def _resample(self, images: torch.Tensor, G_inv: torch.Tensor) -> torch.Tensor:
        """images [N, C, H, W] at the input positions G_inv [N, 3, 3] of each output pixel."""
        N, C, H, W = images.shape
        device = images.device
        # NVIDIA's margin: the bounding box of the transformed corner pixels over the batch, plus twice the half-length
        # of the sym6 filter, beyond the image, within [0, size - 1]: [left, top, right, bottom] (a device tensor).
        cx, cy = (W - 1) / 2, (H - 1) / 2
        corners = G_inv @ _matrix([-cx, -cy, 1], [cx, -cy, 1], [cx, cy, 1], [-cx, cy, 1], device=device).t()
        Hz_pad = self.Hz_geom.shape[0] // 4
        margin = corners[:, :2, :].permute(1, 0, 2).flatten(1)  # [xy, N * 4]
        margin = torch.cat([-margin, margin]).max(dim=1).values
        margin = margin + _constant((Hz_pad * 2 - cx, Hz_pad * 2 - cy) * 2, device)
        margin = margin.max(_constant((0.0,) * 4, device)).min(_constant((W - 1, H - 1) * 2, device)).ceil()

        if images.device.type == 'cpu' if self.host_margin is None else self.host_margin:
            # Where the host computes, reading the margin back costs no wait: NVIDIA's least padding, and its
            # re-centring translation of the padded image (the same positions as NVIDIA's, at NVIDIA's cost).
            left, top, right, bottom = (int(m) for m in margin.tolist())
            images = F.pad(images, [left, right, top, bottom], mode='reflect')
            G_inv = _translate2d((left - right) / 2, (top - bottom) / 2, device) @ G_inv
            images = upfirdn2d.upsample2d(images, self.Hz_geom, up=2)
        else:
            # On a GPU, pad by size - 1 on every side and keep NVIDIA's margin only: before the upsampling (whose
            # filter reads beyond NVIDIA's padded image: zeros there) and after it (grid sampling reads zeros beyond
            # it). The padded image, symmetric about the original one, is centred on it: no re-centring.
            images = F.pad(images, [W - 1, W - 1, H - 1, H - 1], mode='reflect')
            images = images * self._window(margin, W - 1, H - 1, W, H, 1).to(images.dtype)
            images = upfirdn2d.upsample2d(images, self.Hz_geom, up=2)
            images = images * self._window(margin, W - 1, H - 1, W, H, 2).to(images.dtype)

        # Pixels of the upsampled image, then the [-1, 1] coordinates of affine_grid.
        G_inv = _scale2d(2, 2, device) @ G_inv @ _scale2d_inv(2, 2, device)
        G_inv = _translate2d(-0.5, -0.5, device) @ G_inv @ _translate2d_inv(-0.5, -0.5, device)
        shape = [N, C, (H + Hz_pad * 2) * 2, (W + Hz_pad * 2) * 2]
        G_inv = _scale2d(2 / images.shape[3], 2 / images.shape[2], device) @ G_inv @ \
            _scale2d_inv(2 / shape[3], 2 / shape[2], device)
        grid = F.affine_grid(theta=G_inv[:, :2, :].to(images.dtype), size=shape, align_corners=False)
        images = grid_sample_gradfix.grid_sample(images, grid)
        return upfirdn2d.downsample2d(images, self.Hz_geom, down=2, padding=-Hz_pad * 2, flip_filter=True)

    @staticmethod
    def _window(margin: torch.Tensor, pad_x: int, pad_y: int, W: int, H: int, up: int) -> torch.Tensor:
        """[H', W'] 0/1 mask of the image padded by (pad_x, pad_y) and upsampled by `up`: 1 on the image widened by
        margin = [left, top, right, bottom]."""
        cols = torch.arange((W + 2 * pad_x) * up, device=margin.device) / up - pad_x  # Pixel column in the image.
        rows = torch.arange((H + 2 * pad_y) * up, device=margin.device) / up - pad_y
        keep_x = (cols >= -margin[0]) & (cols < W + margin[2])
        keep_y = (rows >= -margin[1]) & (rows < H + margin[3])
        return keep_y[:, None] & keep_x[None, :]

    def _colour(self, images: torch.Tensor) -> torch.Tensor:
        """Brightness, contrast, luma flip, hue and saturation as one 4x4 matrix per image: C @ [r, g, b, 1]."""
        N, num_channels, H, W = images.shape
        device, p = images.device, self.p
        rand = lambda *shape: torch.rand(shape, device=device)
        randn = lambda *shape: torch.randn(shape, device=device)
        C = None
        I_4 = _matrix(*np.eye(4).tolist(), device=device)
        v = _constant(tuple((np.asarray([1, 1, 1, 0]) / np.sqrt(3)).tolist()), device)  # The luma axis.

        if self.brightness > 0:
            b = randn(N) * self.brightness_std
            b = torch.where(rand(N) < self.brightness * p, b, 0.0)
            C = _then(_translate3d(b, device), C)
        if self.contrast > 0:
            c = torch.exp2(randn(N) * self.contrast_std)
            c = torch.where(rand(N) < self.contrast * p, c, 1.0)
            C = _then(_scale3d(c, device), C)
        if self.lumaflip > 0:
            i = torch.floor(rand(N, 1, 1) * 2)
            i = torch.where(rand(N, 1, 1) < self.lumaflip * p, i, 0.0)
            C = _then(I_4 - 2 * torch.outer(v, v) * i, C)  # Householder reflection: I - 2 v v^T.
        if self.hue > 0 and num_channels > 1:
            theta = (rand(N) * 2 - 1) * np.pi * self.hue_max
            theta = torch.where(rand(N) < self.hue * p, theta, 0.0)
            C = _then(_rotate3d(v, theta, device), C)
        if self.saturation > 0 and num_channels > 1:
            s = torch.exp2(randn(N, 1, 1) * self.saturation_std)
            s = torch.where(rand(N, 1, 1) < self.saturation * p, s, 1.0)
            vv = torch.outer(v, v)
            C = _then(vv + (I_4 - vv) * s, C)  # The luma component kept, the chroma scaled by s.

        if C is None:
            return images
        C = C.to(images.dtype)
        images = images.reshape(N, num_channels, H * W)
        if num_channels == 3:
            images = C[:, :3, :3] @ images + C[:, :3, 3:]
        elif num_channels == 1:
            C = C[:, :3, :].mean(dim=1, keepdim=True)  # L = the mean of r, g, b for r = g = b = L.
            images = images * C[:, :, :3].sum(dim=2, keepdim=True) + C[:, :, 3:]
        else:
            raise ValueError(f'AugmentPipe: the colour transformations take RGB (3 channels) or L (1 channel) images, '
                             f'got {num_channels} channels')
        return images.reshape(N, num_channels, H, W)

    def _filter(self, images: torch.Tensor) -> torch.Tensor:
        """Image-space filtering: each band's gain drawn, the combined zero-phase filter applied separably."""
        N, C, H, W = images.shape
        device, p = images.device, self.p
        num_bands, num_taps = self.Hz_fbank.shape
        pad = num_taps // 2
        if min(H, W) <= pad:
            raise ValueError(f'AugmentPipe: the image-space filter needs images larger than {pad}x{pad} (its '
                             f'reflection padding), got {H}x{W}')
        expected_power = _constant(tuple((np.array([10, 1, 1, 1]) / 13).tolist()), device)  # Of a 1/f spectrum.
        bands = torch.arange(num_bands, device=device)
        g = None  # [N, bands]: the gain of each band.
        for i, band_strength in enumerate(self.imgfilter_bands):
            t_i = torch.exp2(torch.randn([N], device=device) * self.imgfilter_std)
            t_i = torch.where(torch.rand([N], device=device) < self.imgfilter * p * band_strength, t_i, 1.0)
            t = torch.where(bands == i, t_i[:, None], 1.0)  # Band i amplified by t_i, the others kept ...
            t = t / (expected_power * t.square()).sum(dim=-1, keepdim=True).sqrt()  # ... at the expected power.
            g = t if g is None else g * t
        taps = (g @ self.Hz_fbank).to(images.dtype)  # [N, taps], symmetric
        taps = taps.unsqueeze(1).repeat([1, C, 1]).reshape(N * C, 1, 1, num_taps)
        images = F.pad(images.reshape(1, N * C, H, W), [pad] * 4, mode='reflect')
        images = conv2d_gradfix.conv2d(images, taps, groups=N * C)                  # Along x ...
        images = conv2d_gradfix.conv2d(images, taps.transpose(2, 3), groups=N * C)  # ... and along y.
        return images.reshape(N, C, H, W)

    def _corruptions(self, images: torch.Tensor) -> torch.Tensor:
        """Additive noise and cutout."""
        N, C, H, W = images.shape
        device, p = images.device, self.p
        if self.noise > 0:
            sigma = torch.randn([N, 1, 1, 1], device=device).abs() * self.noise_std
            sigma = torch.where(torch.rand([N, 1, 1, 1], device=device) < self.noise * p, sigma, 0.0)
            images = images + torch.randn([N, C, H, W], device=device) * sigma
        if self.cutout > 0:
            size = torch.where(torch.rand([N, 1, 1, 1], device=device) < self.cutout * p, self.cutout_size, 0.0)
            center = torch.rand([N, 2, 1, 1, 1], device=device)  # (x, y) in [0, 1) of the size
            x = (torch.arange(W, device=device).reshape(1, 1, 1, W) + 0.5) / W
            y = (torch.arange(H, device=device).reshape(1, 1, H, 1) + 0.5) / H
            keep = ((x - center[:, 0]).abs() >= size / 2) | ((y - center[:, 1]).abs() >= size / 2)
            images = images * keep.to(images.dtype)
        return images

#----------------------------------------------------------------------------
# DiffAugment (Zhao et al., "Differentiable Augmentation for Data-Efficient GAN Training", NeurIPS 2020).

DIFFAUGMENT_POLICIES = ('color', 'translation', 'cutout')


def DiffAugment(images: torch.Tensor, policy: str) -> torch.Tensor:  # pylint: disable=invalid-name
    """The authors' DiffAugment of a batch [N, C, H, W] (channels first): the comma-separated policies in order,
    each drawing per image as `DiffAugment_pytorch.py` does; '' is the identity.

    color        brightness + U[-0.5, 0.5), then saturation (the deviation from the channel mean) x U[0, 2), then
                 contrast (the deviation from the image mean) x U[0.5, 1.5), each one draw per image;
    translation  an integer shift uniform in +-round(size / 8) per axis (rows first), zeros shifted in;
    cutout       a rectangle of half the size (rounded), its centre uniform (rows first), set to 0.
    """
    names = policy.split(',') if policy else []
    unknown = [name for name in names if name not in DIFFAUGMENT_POLICIES]
    if unknown:
        raise ValueError(f'DiffAugment: unknown policy {unknown[0]!r} in {policy!r}; the policy is a comma-separated '
                         f'list of {", ".join(DIFFAUGMENT_POLICIES)}')
    for name in names:
        images = _DIFFAUGMENT_FNS[name](images)
    return images


def _diffaugment_color(x: torch.Tensor) -> torch.Tensor:
    draw = lambda: torch.rand(x.shape[0], 1, 1, 1, dtype=x.dtype, device=x.device)
    x = x + (draw() - 0.5)
    mean = x.mean(dim=1, keepdim=True)
    x = (x - mean) * (draw() * 2) + mean
    mean = x.mean(dim=[1, 2, 3], keepdim=True)
    return (x - mean) * (draw() + 0.5) + mean


def _diffaugment_translation(x: torch.Tensor, ratio: float = 0.125) -> torch.Tensor:
    N, _, H, W = x.shape
    limits = [int(H * ratio + 0.5), int(W * ratio + 0.5)]
    # Output pixel (i, j) reads input pixel (i + ty, j + tx): a shift of the content by (-ty, -tx).
    t = [torch.randint(-m, m + 1, size=[N, 1, 1], device=x.device).reshape(N) for m in limits]
    shift = -torch.stack(t, dim=1)
    return flip_translate(x, torch.zeros(N, dtype=torch.bool, device=x.device), shift, fill=0.0)


def _diffaugment_cutout(x: torch.Tensor, ratio: float = 0.5) -> torch.Tensor:
    N, _, H, W = x.shape
    h, w = int(H * ratio + 0.5), int(W * ratio + 0.5)
    # The rectangle's centre: uniform over the pixels, and over one more position where the side is even.
    oy = torch.randint(0, H + (1 - h % 2), size=[N, 1, 1], device=x.device)
    ox = torch.randint(0, W + (1 - w % 2), size=[N, 1, 1], device=x.device)
    rows = torch.arange(H, device=x.device).reshape(1, H, 1) - (oy - h // 2)  # Row within the rectangle.
    cols = torch.arange(W, device=x.device).reshape(1, 1, W) - (ox - w // 2)
    inside = (rows >= 0) & (rows < h) & (cols >= 0) & (cols < w)  # [N, H, W]
    return x * (~inside).to(x.dtype).unsqueeze(1)


_DIFFAUGMENT_FNS = {'color': _diffaugment_color, 'translation': _diffaugment_translation, 'cutout': _diffaugment_cutout}
