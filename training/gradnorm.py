"""Gradient normalization (GN) of a discriminator (Wu et al., "Gradient Normalization for Generative
Adversarial Networks", ICCV 2021), and the fast generator path of the authors' follow-up work.

For a discriminator f (conditional: f_y, the label passed through unchanged) and an input x,

    f_hat(x) = f(x) / (||grad_x f(x)||_2 + zeta(f(x)))

with zeta(f) = |f| (GN, the paper's choice), zeta = 1 (GN-1) or zeta = 0 (GN-0). Writing
g = grad_x f and n = ||g||, for a piecewise-linear f (ReLU/LeakyReLU, linear layers, average
pooling: its Hessian vanishes almost everywhere) one gets

    grad_x f_hat = g * (n + zeta - f * zeta'(f)) / (n + zeta)^2,

which for GN is n * g / (n + |f|)^2: |f_hat| <= 1 and ||grad_x f_hat|| = (n / (n + |f|))^2 <= 1,
so the normalized discriminator is 1-Lipschitz. GN-0 has ||grad_x f_hat|| = 1 exactly but an
unbounded |f_hat| = |f| / n; GN-1 has ||grad_x f_hat|| = n / (n + 1) < 1 and |f_hat| = |f| / (n + 1)
unbounded as well.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

#----------------------------------------------------------------------------


class GNOutput(NamedTuple):
    f_hat: torch.Tensor      # Normalized discriminator output, shaped like f.
    f: torch.Tensor          # Raw discriminator output.
    grad_norm: torch.Tensor  # Per-sample ||grad_x f||, shaped like f.


ZETAS = ('abs', 1, 0)


def check_zeta(zeta: str | float) -> None:
    if zeta not in ZETAS:
        raise ValueError(f'zeta must be one of {", ".join(repr(z) for z in ZETAS)}; got {zeta!r}')


def per_sample_norm(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """L2 norm of each sample's gradient over all non-batch dimensions (C, H, W), shaped like `like`.

    Reduces over the dimensions in place of flattening, so a channels-last gradient is not copied."""
    return torch.linalg.vector_norm(grad, dim=list(range(1, grad.ndim))).reshape(like.shape)


def normalize(f: torch.Tensor, grad_norm: torch.Tensor, zeta: str | float = 'abs') -> torch.Tensor:
    """f / (grad_norm + zeta(f)), elementwise, without ever producing NaN or Inf.

    The denominator is clamped from below by eps = sqrt(smallest normal number of the dtype)
    (1.1e-19 in float32, 1.5e-154 in float64). That is the one place an epsilon is needed:
      * f = 0 with grad f = 0 (dead ReLUs, an all-zero layer) would give 0/0; the clamp yields 0;
      * GN-0 on a locally constant f would divide by n = 0;
      * the backward divides by the squared denominator, which must stay a normal number.
    Far below any denominator met in practice, it leaves every other value bit-for-bit unchanged.
    """
    if zeta == 'abs':
        offset = f.abs()
    else:
        check_zeta(zeta)
        offset = zeta
    eps = torch.finfo(f.dtype).tiny ** 0.5
    return f / (grad_norm + offset).clamp_min(eps)


def normalize_gradient(D: Callable[..., torch.Tensor], x: torch.Tensor, *args, zeta: str | float = 'abs',
                       grad_norm_scale: float = 1.0, **kwargs) -> GNOutput:
    """Gradient-normalized discriminator output f_hat = f / (||grad_x f|| + zeta) for the batch x.

    f = D(x, *args, **kwargs); the gradient is taken w.r.t. x only (labels in *args/**kwargs are
    passed through) as grad_x sum_i f(x_i), which is every sample's own gradient as long as D treats
    samples independently; its norm is taken per sample over C, H, W. The gradient is built with
    create_graph=True so that a loss on f_hat back-propagates through ||grad_x f|| (double
    backward) into D's parameters, and into x when x requires grad (e.g. fakes of the generator).

    An x that does not require grad (reals, detached fakes) is replaced by a detached copy that does,
    leaving the caller's tensor untouched. `grad_norm_scale` multiplies ||grad_x f|| before it is
    used: the norm w.r.t. another input that x is an exact linear image of (progressive StyleGAN:
    the full-resolution image, see `Discriminator.input_grad_scale` in training/networks/stylegan.py).
    Returns GNOutput(f_hat, f, grad_norm), grad_norm already scaled.
    """
    check_zeta(zeta)
    if not x.requires_grad:
        x = x.detach().requires_grad_(True)
    f = D(x, *args, **kwargs)
    grad, = torch.autograd.grad(f.sum(), x, create_graph=True)
    grad_norm = per_sample_norm(grad, f) * grad_norm_scale
    return GNOutput(normalize(f, grad_norm, zeta), f, grad_norm)


def generator_backward_fast(D: Callable[..., torch.Tensor], x: torch.Tensor, *args,
                            loss_fn: Callable[[torch.Tensor], torch.Tensor], zeta: str | float = 'abs',
                            grad_norm_scale: float = 1.0, gain: float | torch.Tensor = 1.0,
                            **kwargs) -> tuple[torch.Tensor, GNOutput]:
    """Back-propagate loss_fn(f_hat(x)) into whatever produced x, with one first-order backward through D.

    The exact generator gradient needs the double backward of `normalize_gradient`. For a
    piecewise-linear D the Hessian term vanishes, and with L = loss_fn(f_hat), chain rule gives

        dL/dx_i = dL/df_hat_i * (n_i + zeta - f_i zeta'(f_i)) / (n_i + zeta)^2 * g_i
                = w_i * g_i,

    where w_i is exactly d loss_fn(f / (n + zeta(f))) / d f_i with n held constant. So: run D once,
    back-propagate sum_i f_i (whose gradient at x_i is g_i), and in a hook on x, where every g_i
    has arrived, compute n_i, f_hat_i and w_i and pass w_i * g_i on to the generator instead.
    This is exact (to float rounding) for piecewise-linear D and an approximation otherwise.

    x must require grad (it is the generator's output). The gradients this leaves in D's own
    parameters are those of sum_i f_i, not of the loss: the training loop ignores them in the G
    step. `grad_norm_scale` is that of `normalize_gradient`. `gain` multiplies the gradient that
    reaches the generator (loss scaling, gradient accumulation); it is applied to the seed of the
    backward through D, so that a low-precision D back-propagates the scaled values (the point
    of loss scaling), and divided out of the norm in the hook. Returns (loss, GNOutput), both
    detached and unscaled, available once the backward has run.
    """
    check_zeta(zeta)
    if not x.requires_grad:
        raise ValueError('generator_backward_fast: x must require grad (it should be the generator output)')
    f = D(x, *args, **kwargs)
    results = {}

    def rescale(grad: torch.Tensor) -> torch.Tensor:  # grad = gain * g.
        grad_norm = per_sample_norm(grad, f) * (grad_norm_scale / gain)
        with torch.enable_grad():
            f_leaf = f.detach().requires_grad_(True)
            f_hat = normalize(f_leaf, grad_norm, zeta)
            loss = loss_fn(f_hat)
            weight, = torch.autograd.grad(loss, f_leaf)
        results['loss'] = loss.detach()
        results['out'] = GNOutput(f_hat.detach(), f.detach(), grad_norm)
        return grad * weight.reshape([-1] + [1] * (grad.ndim - 1))

    handle = x.register_hook(rescale)
    try:
        f.backward(torch.ones_like(f) * gain)
    finally:
        handle.remove()
    return results['loss'], results['out']
