"""Improved precision and recall (Kynkaanniemi et al. 2019): k-nearest-neighbour manifolds of VGG16
features of real and generated images, as in StyleGAN2-ADA."""

from __future__ import annotations

import numpy as np
import torch

from . import detectors, features


def precision_recall_from_features(real_features: np.ndarray | torch.Tensor, gen_features: np.ndarray | torch.Tensor,
                                   nhood_size: int = 3, batch_size: int = 4096,
                                   device: torch.device | str = 'cpu') -> tuple[float, float]:
    """Improved precision and recall (Kynkaanniemi et al. 2019).

    Each sample of a set is the centre of a ball reaching to its k-th nearest neighbour in the same
    set (k = `nhood_size`, the sample itself not counted); the union of the balls estimates the
    manifold of that set. With Euclidean distances between features,

        precision = fraction of generated samples inside the manifold of the real samples
        recall    = fraction of real samples inside the manifold of the generated samples

    Distances are computed for `batch_size` rows at a time on `device`.
    """
    real = torch.as_tensor(real_features, device=device).to(torch.float32)
    gen = torch.as_tensor(gen_features, device=device).to(torch.float32)
    if real.ndim != 2 or gen.ndim != 2 or real.shape[1] != gen.shape[1]:
        raise ValueError(f'precision/recall: mismatched feature sets {tuple(real.shape)} and {tuple(gen.shape)}')
    if min(len(real), len(gen)) <= nhood_size:
        raise ValueError(f'precision/recall: needs more than {nhood_size} samples of each set')
    precision = _fraction_in_manifold(manifold=real, probes=gen, nhood_size=nhood_size, batch_size=batch_size)
    recall = _fraction_in_manifold(manifold=gen, probes=real, nhood_size=nhood_size, batch_size=batch_size)
    return precision, recall


def _fraction_in_manifold(manifold: torch.Tensor, probes: torch.Tensor, nhood_size: int, batch_size: int) -> float:
    # The nearest neighbour of a manifold sample within the manifold is itself, at distance 0: take the (k+1)-th.
    radii = torch.cat([torch.cdist(rows, manifold).kthvalue(nhood_size + 1, dim=1).values
                       for rows in manifold.split(batch_size)])
    inside = torch.cat([(torch.cdist(rows, manifold) <= radii).any(dim=1) for rows in probes.split(batch_size)])
    return float(inside.to(torch.float64).mean())


def compute_pr(opts: features.MetricOptions, max_real: int | None, num_gen: int, nhood_size: int,
               batch_size: int) -> tuple[float, float]:
    """Precision and recall of `num_gen` generated images against up to `max_real` training images
    (None = all), with neighbourhoods of `nhood_size`. NaN on ranks other than 0.

    The features come from opts.pr_detector_url when given, else from StyleGAN2-ADA's VGG16 export;
    the Inception detector option (opts.detector_url) never applies here."""
    detector_url = opts.pr_detector_url or detectors.VGG16_URL
    real_features, gen_features = features.compute_all_features(opts, detector_url, max_real=max_real, num_gen=num_gen)

    if opts.rank != 0:
        return float('nan'), float('nan')
    return precision_recall_from_features(real_features, gen_features, nhood_size=nhood_size,
                                          batch_size=batch_size, device=opts.device)
