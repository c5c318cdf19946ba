"""Feature detectors: the TorchScript networks whose outputs the metrics compare (Inception-v3 for FID,
IS and KID, VGG16 for precision/recall), fetched with `dnnlib.util.open_url` and its download cache,
read only after torch_utils/bounded_read.py's archive check, and loaded once per process and device.
Every detector call runs at full float32 precision (`run_detector`).
"""

from __future__ import annotations

import os
import urllib.parse
from typing import BinaryIO

import torch

import dnnlib
from torch_utils import bounded_read, compat, devices

# Inception-v3 of the official TensorFlow FID and IS code (inception-2015-12-05.tgz), as exported to
# TorchScript by StyleGAN2-ADA.
INCEPTION_URL = 'https://nvlabs-fi-cdn.nvidia.com/stylegan2-ada-pytorch/pretrained/metrics/inception-2015-12-05.pt'

# VGG16 of the precision/recall paper (Kynkaanniemi et al. 2019), as exported to TorchScript by StyleGAN2-ADA.
VGG16_URL = 'https://nvlabs-fi-cdn.nvidia.com/stylegan2-ada-pytorch/pretrained/metrics/vgg16.pt'

# The arithmetic of every detector call (`run_detector`), part of the key of cached dataset statistics
# (metrics/features.py), so that statistics computed with other arithmetic are not reused.
ARITHMETIC = 'float32, TF32 off'


class DetectorUnavailableError(RuntimeError):
    """The feature detector could not be fetched or loaded (typically: no network access).

    The message is one line naming the file to fetch and the option that points to a local copy;
    the training loop catches this error and carries on without metrics.
    """


_detectors: dict[tuple[str, str], torch.jit.ScriptModule] = {}  # (url, device) -> detector, loaded once per process.


def _check_torchscript(f: BinaryIO, url: str) -> BinaryIO:
    """`f`, once it has passed bounded_read's archive check and holds the constants.pkl that torch.jit.save
    writes (torch.save's weights-only files do not); ValueError (one line) otherwise."""
    archive = bounded_read.check_torch_archive(f, url)
    if not any(name.rpartition('/')[2] == 'constants.pkl' for name in archive.entries):
        raise ValueError(f'{url} is not TorchScript (no constants.pkl: written by torch.save, not torch.jit.save)')
    return f


def get_feature_detector(url: str, device: torch.device = torch.device('cpu'), num_gpus: int = 1, rank: int = 0,
                         verbose: bool = False, option: str = '--detector') -> torch.jit.ScriptModule:
    """The TorchScript feature detector at `url` (an http(s)/file URL or a local path), on `device`;
    `option` is the command-line option that replaces it, named in the error message.

    Detectors follow StyleGAN2-ADA's calling convention: uint8 images [N, 3, H, W] of any size in,
    `detector(x, return_features=True)` -> features, `detector(x, no_output_bias=True)` -> class
    probabilities. Under torch.distributed, rank 0 fetches the file into the download cache while the
    other processes wait, so it is downloaded once. Failure raises DetectorUnavailableError on every rank.
    """
    key = (url, str(device))
    if key in _detectors:
        return _detectors[key]
    if num_gpus > 1 and rank != 0:
        torch.distributed.barrier()
    error = None
    try:
        with dnnlib.util.open_url(url, verbose=verbose and rank == 0) as f:
            _detectors[key] = compat.load_torchscript(_check_torchscript(f, url), map_location=device).eval()
    except (OSError, RuntimeError, ValueError) as e:
        error = e
    if num_gpus > 1 and rank == 0:
        torch.distributed.barrier()
    if error is not None:
        name = os.path.basename(urllib.parse.urlparse(url).path) or 'detector.pt'
        if isinstance(error, OSError) and dnnlib.util.is_url(url):
            advice = (f'download {url} on a machine with internet access, copy it here and pass '
                      f'{option}=/path/to/{name}')
        else:
            default = VGG16_URL if option == '--pr-detector' else INCEPTION_URL
            advice = f'pass {option}=PATH_OR_URL of a TorchScript detector such as {default}'
        raise DetectorUnavailableError(f'cannot load the feature detector {url}: {dnnlib.util.first_line(error)}; {advice}') from error
    return _detectors[key]


def run_detector(detector: torch.jit.ScriptModule, images: torch.Tensor, detector_kwargs: dict) -> torch.Tensor:
    """Detector output for uint8 images [N, C, H, W]; grayscale (C = 1) is repeated to the RGB the detectors expect.

    The detector runs at ARITHMETIC: TF32 off for its matmuls and convolutions whatever the caller's switches
    (a training run's --precision, PyTorch's default of TF32 convolutions), restored afterwards, so that its
    features, and the metrics, are the same on every GPU and comparable with published ones."""
    if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f'feature detectors take uint8 images [N, 1 or 3, H, W], got {images.dtype} {tuple(images.shape)}')
    if images.shape[1] == 1:
        images = images.repeat([1, 3, 1, 1])
    with devices.full_precision():
        return detector(images, **detector_kwargs)
