"""Small stand-ins for what the metrics and the training read: a TorchScript detector with random weights (and the
features it gives), a generator that is a random linear map, and a dataset zip of random images in dataset_tool's
format (and the dataset kwargs that read it)."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import torch

from tests.support.images import png_bytes
from torch_utils import persistence


class TinyDetector(torch.nn.Module):
    """StyleGAN2-ADA's detector calling convention, with random weights: uint8 [N, 3, H, W] of any size
    -> features [N, num_features] (return_features=True) or class probabilities [N, num_classes]."""

    def __init__(self, num_features: int = 6, num_classes: int = 5):
        super().__init__()
        self.features = torch.nn.Linear(3 * 2 * 2, num_features)
        self.logits = torch.nn.Linear(num_features, num_classes)

    def forward(self, x: torch.Tensor, return_features: bool = False, no_output_bias: bool = False) -> torch.Tensor:
        if x.dtype != torch.uint8 or x.shape[1] != 3:
            raise ValueError('expected uint8 RGB images')
        pooled = torch.nn.functional.adaptive_avg_pool2d(x.to(torch.float32) / 255, [2, 2]).flatten(1)
        features = self.features(pooled * 4)
        if return_features:
            return features
        logits = features @ self.logits.weight.t()
        if not no_output_bias:
            logits = logits + self.logits.bias
        return torch.softmax(logits, dim=1)


def make_detector(path: str, seed: int = 0) -> TinyDetector:
    """Save a scripted TinyDetector to `path`; return the eager module for independent computations."""
    torch.manual_seed(seed)
    detector = TinyDetector().eval()
    torch.jit.script(detector).save(path)
    return detector


def write_dataset_zip(path: str, num_images: int = 24, resolution: int = 8, labels: list | None = None,
                      seed: int = 0) -> np.ndarray:
    """A dataset zip in dataset_tool's format (PNGs + dataset.json); returns the images uint8 [N, 3, H, W]."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=[num_images, 3, resolution, resolution], dtype=np.uint8)
    names = [f'00000/img{i:08d}.png' for i in range(num_images)]
    with zipfile.ZipFile(path, 'w') as zf:
        for name, image in zip(names, images):
            zf.writestr(name, png_bytes(image.transpose(1, 2, 0)))
        json_labels = None if labels is None else [[name, int(label)] for name, label in zip(names, labels)]
        zf.writestr('dataset.json', json.dumps(dict(labels=json_labels)))
    return images


@persistence.persistent_class
class TinyGenerator(torch.nn.Module):
    """A random linear map from (z, c) to images in [-1, 1]."""

    def __init__(self,
        z_dim: int = 4,             # Latent size.
        c_dim: int = 0,             # Number of classes, 0 = unconditional.
        img_resolution: int = 8,    # Output resolution.
        img_channels: int = 3,      # Output channels.
    ):
        super().__init__()
        self.z_dim, self.c_dim, self.img_resolution, self.img_channels = z_dim, c_dim, img_resolution, img_channels
        self.fc = torch.nn.Linear(z_dim + c_dim, img_channels * img_resolution ** 2)

    def forward(self, z: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.fc(torch.cat([z, c], dim=1)))
        return x.reshape(-1, self.img_channels, self.img_resolution, self.img_resolution)


def dataset_kwargs_of(path: str) -> dict:
    return dict(class_name='training.data.dataset.ImageFolderDataset', path=path)


def features_of(detector: TinyDetector, images: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return detector(torch.from_numpy(images), return_features=True).double().numpy()
