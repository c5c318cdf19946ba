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

The discriminator step differentiates a loss on f_hat w.r.t. D's parameters theta, through f and
through n, which is itself a first backward of f. Done plainly (`normalize_gradient`), that is a
second backward through both graphs: through the first backward's (per conv layer, a convolution
of the incoming gradient and a weight gradient) and, for f's own term, through the forward graph
again (an input gradient and a weight gradient per layer). For a piecewise-linear D that treats
samples independently the forward graph can be skipped: within the linear region of x, f is
affine in x and in every layer's bias b_l, so

    f(x) = <g, x> + sum_l <dy_l, b_l>,      dy_l = df/dy_l at that layer's output y_l

(b_l broadcast over y_l's positions), and the first backward computes every dy_l on its way to g.
The right side equals f as a function of theta wherever the region does not change, so it has
f's gradient w.r.t. theta (and, since the Hessian vanishes, w.r.t. x: g). Taking f in this form
(`bias_layers`), the second backward runs through the first backward's graph only: per conv layer
four convolutions in all (forward, first backward, two in the second) instead of six. A missing
bias term would break the identity silently, so `linearization_error` measures it on a batch and
the loss checks it once before relying on it (training/step/loss.py).
"""

from __future__ import annotations

import copy
from typing import Callable, NamedTuple, Sequence

import torch
from torch import nn

from ops import conv2d_gradfix

#----------------------------------------------------------------------------


class GNOutput(NamedTuple):
    f_hat: torch.Tensor      # Normalized discriminator output, shaped like D's output f.
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
                       grad_norm_scale: float = 1.0, bias_layers: Sequence[nn.Module] | None = None,
                       **kwargs) -> GNOutput:
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
    Returns GNOutput(f_hat, grad_norm), grad_norm already scaled.

    `bias_layers` (from `linearizable_layers(D)`): f enters f_hat as <g, x> + sum_l <dy_l, b_l>
    (the module docstring), with f's value but a graph through the first backward only.

    D runs inside `conv2d_gradfix.higher_order_gradients()`: layers built on ops/conv2d_gradfix and
    ops/relu_pool_gradfix record their autograd Functions, whose double backward is cheap.
    """
    check_zeta(zeta)
    caller_wants_input_grad = x.requires_grad
    if not x.requires_grad:
        x = x.detach().requires_grad_(True)
    with conv2d_gradfix.higher_order_gradients():  # D's layers record ops with cheap double backwards.
        if bias_layers is None:
            f = D(x, *args, **kwargs)
            grad, = torch.autograd.grad(f.sum(), x, create_graph=True)
        else:
            f, grad, f_affine = _affine_decomposition(D, bias_layers, x, *args, input_grad=caller_wants_input_grad,
                                                      **kwargs)
            f = f.detach() + (f_affine - f_affine.detach())  # f's value, f_affine's graph.
    grad_norm = per_sample_norm(grad, f) * grad_norm_scale
    return GNOutput(normalize(f, grad_norm, zeta), grad_norm)


def linearizable_layers(D: nn.Module) -> list[nn.Module] | None:
    """D's layers with a bias, for `normalize_gradient(bias_layers=...)`; None where the identity may not hold.

    It needs D to declare `is_piecewise_linear` and `is_sample_independent`, and every parameter
    to be a weight or bias of an nn.Conv2d or nn.Linear (also under a parametrization such as
    spectral normalization), whose bias is added to the layer's output.
    """
    if not (getattr(D, 'is_piecewise_linear', False) and getattr(D, 'is_sample_independent', False)):
        return None
    for module in D.modules():
        if next(module.parameters(recurse=False), None) is None:
            continue
        if not isinstance(module, (nn.Conv2d, nn.Linear, nn.utils.parametrize.ParametrizationList)):
            return None
    return [m for m in D.modules() if isinstance(m, (nn.Conv2d, nn.Linear)) and m.bias is not None]


def linearization_error(D: Callable[..., torch.Tensor], bias_layers: Sequence[nn.Module], x: torch.Tensor,
                        *args, **kwargs) -> float:
    """max |f - (<g, x> + sum_l <dy_l, b_l>)| over the batch, relative to the largest term (a host sync)."""
    x = x.detach().requires_grad_(True)
    f, _, f_affine, terms = _affine_decomposition(D, bias_layers, x, *args, return_terms=True, **kwargs)
    scale = torch.stack([t.detach().abs() for t in terms]).amax(dim=0).reshape(f.shape) + f.detach().abs()
    return float(((f - f_affine).detach().abs() / scale.clamp_min(torch.finfo(scale.dtype).tiny)).max())


def affine_form_error(D: nn.Module, x: torch.Tensor, *args: torch.Tensor, seed: int = 0) -> float:
    """`linearization_error` of a float64 copy of D whose biases are drawn at random, in eval mode.

    float64, so that the identity is judged on D, not on rounding (float32 with TF32 matmuls misses it by
    ~1e-3); random non-zero biases, so that a bias D adds without registering it (e.g. a layer whose weight
    and bias D uses functionally, outside the layer's forward) changes f and the identity fails; eval mode,
    so that spectral normalization takes no power-iteration step. D itself is untouched.
    """
    copy_of_D = copy.deepcopy(D).to(torch.float64).eval()
    bias_layers = linearizable_layers(copy_of_D)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in bias_layers:
            layer.bias.copy_(torch.randn(layer.bias.shape, generator=generator, dtype=torch.float64) * 0.3)
    args = [a.to(torch.float64) if torch.is_floating_point(a) else a for a in args]
    with torch.autocast(x.device.type, enabled=False):
        return linearization_error(copy_of_D, bias_layers, x.detach().to(torch.float64), *args)


def _affine_decomposition(D: Callable[..., torch.Tensor], bias_layers: Sequence[nn.Module], x: torch.Tensor, *args,
                          input_grad: bool = False, return_terms: bool = False, **kwargs):
    """f = D(x), g = grad_x sum f (create_graph) and f_affine = <g, x> + sum_l <dy_l, b_l>, per sample, shaped like f.

    input_grad: f_affine also differentiable w.r.t. x (a generator's output), else only w.r.t. D's parameters."""
    output_grads = []  # (dy_l, b_l) of every bias layer's call on the way from f to x.

    def watch_output(module: nn.Module, _inputs, output: torch.Tensor) -> None:
        if output.requires_grad:
            output.register_hook(lambda grad: output_grads.append((grad, module.bias)))

    handles = [layer.register_forward_hook(watch_output) for layer in bias_layers]
    try:
        f = D(x, *args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    grad, = torch.autograd.grad(f.sum(), x, create_graph=True)
    # <g, x>: its gradient w.r.t. theta flows through g; w.r.t. x it is g itself (the Hessian term vanishes).
    inner = grad * x.detach()
    if input_grad:
        inner = inner + grad.detach() * (x - x.detach())
    terms = [inner.sum(dim=list(range(1, x.ndim))).to(f.dtype)]
    for dy, bias in output_grads:  # dy: [N, C] (linear) or [N, C, H, W] (conv); b_l is added at every position.
        per_channel = dy.sum(dim=list(range(2, dy.ndim))) if dy.ndim > 2 else dy
        terms.append((per_channel * bias).sum(dim=1).to(f.dtype))
    f_affine = torch.stack(terms).sum(dim=0).reshape(f.shape)
    return (f, grad, f_affine, terms) if return_terms else (f, grad, f_affine)


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

    x must require grad (it is the generator's output). Gradients this would leave in D's own
    parameters are those of sum_i f_i, not of the loss; the training loop's G step freezes D's
    parameters (requires_grad False), so none are made. `grad_norm_scale` is that of `normalize_gradient`. `gain` multiplies the gradient that
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
        results['out'] = GNOutput(f_hat.detach(), grad_norm)
        return grad * weight.reshape([-1] + [1] * (grad.ndim - 1))

    handle = x.register_hook(rescale)
    try:
        f.backward(torch.ones_like(f) * gain)
    finally:
        handle.remove()
    return results['loss'], results['out']
