"""L_D, the GN-GAN paper's estimate of a discriminator's Lipschitz constant (its experimental analysis of the theorem
on layer-wise constraints, Theorem 5 in the paper's shared numbering): the largest input-gradient norm of the output the loss sees, over N real and N generated images,

    L_D = max_{x in X_real u X_gen} ||grad_x s(x)||_2,     s = f_hat = f / (||grad_x f|| + zeta(f)) under GN
                                                           (--norm=gn/gn1/gn0), s = f otherwise,

which is a lower bound of the Lipschitz constant of s (a gradient norm at any point is at most the constant). The
gradient is per sample, w.r.t. the image D is defined on (progressive StyleGAN: scaled by `D.input_grad_scale`, as
the loss does); under GN it goes through ||grad_x f|| (double backward), so it also counts the Hessian term that a
smooth activation adds. D is a copy in eval mode (spectral normalization then takes no power-iteration step), its
weights as they are; the real images are the first N of the training set (fewer when it is smaller), scaled to
[-1, 1] as in training, with their labels for a conditional D; the generated ones are G's float output (as D sees
it in training, not quantized to uint8) for latents and labels drawn as the other metrics draw them (metrics/
features.py). Computed in batches of opts.batch_size images (memory bounded by one batch's double backward); with
several processes each takes its share of the batches and the maximum is reduced across them.
"""

from __future__ import annotations

import copy
import math
from typing import Protocol

import numpy as np
import torch

import dnnlib

from . import features

#----------------------------------------------------------------------------


class DScore(Protocol):
    """The output s of D that a run's loss sees, given by the training code (training.step.LossScore): this room
    differentiates it and knows nothing of constraints."""
    norm: str  # The run's --norm, recorded with the result.

    def __call__(self, D: torch.nn.Module, x: torch.Tensor, c: torch.Tensor, grad_norm_scale: float) -> torch.Tensor:
        """s(x) [N, 1] for x that requires grad (grad_norm_scale: D.input_grad_scale, as the loss uses it)."""


def score_gradient_norm(D: torch.nn.Module, x: torch.Tensor, c: torch.Tensor, score: DScore,
                        grad_norm_scale: float = 1.0) -> torch.Tensor:
    """Per-sample ||grad_x s(x)|| of the score the loss sees, shape [N]."""
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        grad, = torch.autograd.grad(score(D, x, c, grad_norm_scale).sum(), x)
    return torch.linalg.vector_norm(grad, dim=list(range(1, grad.ndim))).detach() * grad_norm_scale


def _batches(opts: features.MetricOptions, total: int, batch: int):
    """This process's batch indices r, r + num_gpus, ... of ceil(total / batch); every process calls opts.interrupt
    after each round together, also in a round where it has no batch left."""
    num_batches = math.ceil(total / batch)
    for first in range(0, num_batches, opts.num_gpus):
        if first + opts.rank < num_batches:
            yield first + opts.rank
        if opts.interrupt is not None:
            opts.interrupt()


def compute_lipschitz(opts: features.MetricOptions, num: int) -> float:
    """L_D over `num` real and `num` generated images (opts.num_gen / opts.max_real override the counts)."""
    if opts.D is None or opts.G is None:
        raise ValueError('L_D needs the discriminator and the generator: evaluate a training snapshot (it holds D)')
    if opts.d_score is None:
        raise ValueError('L_D needs the output of D that the run\'s loss sees (its --norm)')
    D = copy.deepcopy(opts.D).eval().requires_grad_(False).to(opts.device)
    # Training-mode BatchNorm on batches of bn_batch where asked (the authors' scoring), as metrics/features.py does.
    G = copy.deepcopy(opts.G).train(opts.bn_batch is not None).requires_grad_(False).to(opts.device)
    gen_batch = opts.gen_batch_size if opts.bn_batch is None else opts.bn_batch
    scale = float(getattr(D, 'input_grad_scale', 1.0))
    num_gen = opts.num_gen if opts.num_gen is not None else num
    num_real = num if opts.max_real is None else min(num, opts.max_real)

    if not opts.dataset_kwargs:
        raise ValueError('L_D needs the training set for its real images: give it with --data')
    dataset = dnnlib.util.construct_class_by_name(**dict(opts.dataset_kwargs, max_size=None, xflip=False,
                                                         use_labels=D.c_dim > 0))
    features.check_fits_generator(opts, list(dataset.image_shape), opts.dataset_kwargs)
    if D.c_dim > 0 and dataset.label_dim != D.c_dim:
        raise ValueError(f'the discriminator is conditional on {D.c_dim} classes, but the dataset '
                         f'{opts.dataset_kwargs.get("path")} has {dataset.label_dim} label dimensions')
    num_real = min(num_real, len(dataset))
    largest = torch.zeros([], dtype=torch.float64, device=opts.device)

    # Reals: process r takes batches r, r + num_gpus, ... of the first num_real images.
    batch = opts.batch_size if opts.bn_batch is None else opts.bn_batch
    update = opts.progress_counter('L_D on real images', num_real)
    for index in _batches(opts, num_real, batch):
        items = [dataset[i] for i in range(index * batch, min((index + 1) * batch, num_real))]
        x = torch.from_numpy(np.stack([image for image, _label in items])).to(opts.device, torch.float32) / 127.5 - 1
        c = torch.from_numpy(np.stack([label for _image, label in items]).astype(np.float32)).to(opts.device)
        c = c.reshape(len(items), -1)[:, :D.c_dim]
        largest = torch.maximum(largest, score_gradient_norm(D, x, c, opts.d_score, scale).max().double())
        update(min((index + 1) * batch, num_real))

    # Generated images: block b's latents and labels from an RNG seeded with (seed, b), as metrics/features.py.
    update = opts.progress_counter('L_D on generated images', num_gen)
    for block in _batches(opts, num_gen, batch):
        count = min(batch, num_gen - block * batch)
        rng = np.random.default_rng([opts.seed, block])
        z = torch.from_numpy(rng.standard_normal([count, G.z_dim], dtype=np.float32)).to(opts.device)
        if G.c_dim > 0:
            labels = [dataset.get_label(i) for i in rng.integers(len(dataset), size=count)]
            c = torch.from_numpy(np.stack(labels).astype(np.float32)).to(opts.device)
        else:
            c = torch.zeros([count, 0], device=opts.device)
        with torch.no_grad():
            x = torch.cat([G(z_part, c_part) for z_part, c_part in
                           zip(z.split(gen_batch), c.split(gen_batch))]).float()
        largest = torch.maximum(largest, score_gradient_norm(D, x, c[:, :D.c_dim], opts.d_score, scale).max().double())
        update(min((block + 1) * batch, num_gen))

    if opts.num_gpus > 1:
        torch.distributed.all_reduce(largest, op=torch.distributed.ReduceOp.MAX)
    opts.info.update(data=features.data_path(opts.dataset_kwargs), num_real=num_real, num_gen=num_gen)
    return float(largest)
