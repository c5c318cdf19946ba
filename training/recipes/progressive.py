"""Progressive-growing schedule of StyleGAN v1, as trained by GN-StyleGAN.

Training starts at a low resolution and alternates two kinds of phase, each measured in real
images shown to D ("kimg" = thousands of images):

    stable at resolution R   (phase_kimg)   ->   fade-in to 2R   (fade_kimg)   ->   stable at 2R ...

until the final resolution is reached, where it stays for the rest of the run. Position in the
schedule is expressed as a level of detail (lod), measured down from the final resolution:

    lod = log2(max_resolution) - log2(start_resolution) - phase_idx - clip((phase_kimg_done - phase_kimg) / fade_kimg, 0, 1)

clamped at 0, where phase_idx counts completed (stable + fade-in) pairs. An integer lod L means
training at resolution max_resolution / 2**L; a fractional lod L means fading in resolution
max_resolution / 2**floor(L) over the one below with weight alpha = 1 - (L - floor(L)). The
networks in `training/networks/stylegan.py` read the same lod (`set_lod`) and work at the active
resolution, so reals must be brought to that resolution (training/data/data_stream.py's
`process_reals`).

The constants below are StyleGAN v1's 8-GPU schedule (the paper's run) with the GN-GAN paper's
learning rates; `training/recipes/schedule.py` turns them into the run's per-step plan.
"""

from __future__ import annotations

import math


#----------------------------------------------------------------------------

START_RESOLUTION = 8    # Resolution of the first phase.
PHASE_KIMG = 600        # Thousands of real images per stable phase.
FADE_KIMG = 600         # Thousands of real images per fade-in.
TOTAL_KIMG = 25000      # Length of the whole run (25M real images).
EMA_KIMG = 10           # Half-life of the generator's exponential moving average, in thousands of images.

# Global minibatch (all GPUs together) at each active resolution: StyleGAN v1's 8-GPU run, the one
# the paper trained (v1 train.py: minibatch_base 32, minibatch_dict {8: 256, 16: 128, 32: 64, 64: 32}).
BATCH = {8: 256, 16: 128, 32: 64, 64: 32, 128: 32, 256: 32, 512: 32, 1024: 32}

# Adam learning rate (G and D alike) at each active resolution: 1e-3 up to 64x64, 1.5e-3 above.
LR = {8: 1e-3, 16: 1e-3, 32: 1e-3, 64: 1e-3, 128: 1.5e-3, 256: 1.5e-3, 512: 1.5e-3, 1024: 1.5e-3}

#----------------------------------------------------------------------------


def _log2_exact(value: int, what: str) -> int:
    if value < 1 or value & (value - 1):
        raise ValueError(f'{what} must be a power of two, got {value}')
    return value.bit_length() - 1


def lod_to_resolution(lod: float, max_resolution: int) -> int:
    """Resolution the networks work at for a given lod: max_resolution / 2**floor(lod)."""
    return max_resolution >> math.floor(lod)


def lod_at(cur_nimg: int, max_resolution: int, start_resolution: int = START_RESOLUTION,
           phase_kimg: float = PHASE_KIMG, fade_kimg: float = FADE_KIMG) -> float:
    """Level of detail after `cur_nimg` real images (the formula in the module docstring)."""
    max_log2 = _log2_exact(max_resolution, 'max_resolution')
    start_log2 = _log2_exact(start_resolution, 'start_resolution')
    if not 2 <= start_log2 <= max_log2:
        raise ValueError(f'start_resolution must lie between 4 and max_resolution={max_resolution}, got {start_resolution}')
    if cur_nimg < 0 or phase_kimg < 0 or fade_kimg < 0 or phase_kimg + fade_kimg <= 0:
        raise ValueError('the schedule needs cur_nimg >= 0, phase_kimg >= 0, fade_kimg >= 0 and phase_kimg + fade_kimg > 0')
    kimg = cur_nimg / 1000
    phase_dur = phase_kimg + fade_kimg
    phase_idx = math.floor(kimg / phase_dur)
    kimg_in_phase = kimg - phase_idx * phase_dur
    fade_done = min(max(kimg_in_phase - phase_kimg, 0) / fade_kimg, 1) if fade_kimg > 0 else 0
    return max(float(max_log2 - start_log2 - phase_idx) - fade_done, 0.0)
