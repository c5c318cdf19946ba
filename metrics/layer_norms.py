"""Per-layer Lipschitz constants of a discriminator: panel (c) of the GN-GAN paper's depth study.

For every convolution and linear layer of D, the layer as D applies it is the linear map

    A: v -> layer(v) - layer(0)      on inputs of the shape the layer sees in D's forward pass

(its stride, padding, dilation and input size; the weight as the forward uses it, i.e. after spectral
normalization or an equalized-lr gain; a StyleGAN layer's fused activation is left out, so that A is the linear
part). Its Lipschitz constant is the operator norm ||A||_2 = sigma_max(A), computed by power iteration on A^T A,
A^T being the vector-Jacobian product of A (autograd), without ever forming A:

    v <- A^T A v / ||A^T A v||,   sigma = ||A v||,   until |sigma_k - sigma_{k-1}| <= tol * sigma_k (or max_iter).

Power iteration converges to sigma_max from below, at a rate set by the gap to the next singular value; the
stopping rule bounds the last step's change, not the error, so `tol` is set well below the accuracy wanted (the
tests check 1e-6 against a dense SVD of the layer's matrix, built by applying the layer to every basis vector).

Beside it, `sigma_reshaped` is the largest singular value of the weight reshaped to [out, in * kh * kw], the
quantity spectral normalization divides by (Miyato et al. 2018), of the weight as the layer uses it (so ~1 under
SN); for a convolution the operator norm can differ from it by up to a factor of the kernel's footprint (Tsuzuku et
al. 2018), which is why the paper's "Lipschitz constant of each layer" is computed on the layer as applied. Under SN,
`sigma_raw` is that of the unnormalized weight (what SN divides it by).
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn

#----------------------------------------------------------------------------


@dataclasses.dataclass
class LayerNorm:
    name: str                       # The layer's path in D ('convs.3', 'fc').
    kind: str                       # Its class name.
    input_shape: tuple[int, ...]    # The per-sample shape it is applied to in D's forward pass.
    operator_norm: float            # ||A||_2 by power iteration (the layer as applied).
    sigma_reshaped: float           # sigma_max of the used weight reshaped to [out, -1].
    sigma_raw: float | None         # Under spectral normalization: sigma_max of the raw weight; else None.
    iterations: int                 # Power iterations run.


def is_weight_layer(module: nn.Module) -> bool:
    """Convolutions and linear layers: torch's, and the equalized-lr layers of the StyleGANs (a 2-D or 4-D `weight`
    and a `weight_gain`)."""
    if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
        return True
    weight = getattr(module, 'weight', None)
    return isinstance(weight, torch.Tensor) and weight.ndim in (2, 4) and hasattr(module, 'weight_gain')


def linear_part(layer: nn.Module) -> nn.Module:
    """A float64 copy of `layer` in eval mode (no power-iteration step of SN) with its activation, if fused, made linear."""
    layer = copy.deepcopy(layer).double().eval()
    if hasattr(layer, 'activation'):
        layer.activation = 'linear'
    return layer


def operator_norm(layer: nn.Module, input_shape: tuple[int, ...], tol: float = 1e-6, max_iter: int = 2000,
                  seed: int = 0) -> tuple[float, int]:
    """(||A||_2, iterations) of A: v -> layer(v) - layer(0) on per-sample inputs of `input_shape`, in float64."""
    layer = linear_part(layer)
    generator = torch.Generator().manual_seed(seed)
    zero = torch.zeros((1,) + tuple(input_shape), dtype=torch.float64)
    with torch.no_grad():
        offset = layer(zero)
    v = torch.randn(zero.shape, generator=generator, dtype=torch.float64)
    v /= v.norm()
    sigma, iterations = 0.0, 0
    for iterations in range(1, max_iter + 1):
        v = v.detach().requires_grad_(True)
        u = layer(v) - offset                                   # A v
        new_sigma = float(u.detach().norm())
        w, = torch.autograd.grad(u, v, grad_outputs=u)          # A^T A v
        norm = w.norm()
        if norm == 0:                                           # A v = 0: a zero layer (or a start in its null space).
            return 0.0, iterations
        v = w / norm
        if abs(new_sigma - sigma) <= tol * new_sigma:
            return new_sigma, iterations
        sigma = new_sigma
    return sigma, iterations


def _used_weight(layer: nn.Module) -> torch.Tensor:
    """The weight as the forward pass uses it: after spectral normalization (eval mode: no update) and the gain."""
    with torch.no_grad():
        return layer.weight.detach().double() * float(getattr(layer, 'weight_gain', 1.0))


def layer_norms(D: nn.Module, tol: float = 1e-6, max_iter: int = 2000) -> list[LayerNorm]:
    """A LayerNorm for every conv/linear layer on D's path from the image, in the order of D's forward pass (one call on
    a zero image of D's input shape records what each layer sees). D itself is untouched."""
    D = copy.deepcopy(D).eval().requires_grad_(False)
    shapes: dict[nn.Module, tuple[int, ...]] = {}
    layers = {module: name for name, module in D.named_modules() if is_weight_layer(module)}

    def record(module: nn.Module, inputs: tuple, _output) -> None:
        if inputs[0].requires_grad:  # On the path from the image (not, e.g., a projection D's label embedding).
            shapes.setdefault(module, tuple(inputs[0].shape[1:]))

    handles = [module.register_forward_hook(record) for module in layers]
    try:
        img = torch.zeros([1, D.img_channels, D.img_resolution, D.img_resolution], requires_grad=True)
        c = torch.zeros([1, getattr(D, 'c_dim', 0)])
        if c.shape[1] > 0:
            c[:, 0] = 1
        with torch.enable_grad():
            D(img, c)
    finally:
        for handle in handles:
            handle.remove()
    results = []
    for module, shape in shapes.items():  # Dict order: the order the forward pass reached them.
        norm, iterations = operator_norm(module, shape, tol=tol, max_iter=max_iter)
        sigma = float(torch.linalg.matrix_norm(_used_weight(module).flatten(1), ord=2))
        raw = None
        if nn.utils.parametrize.is_parametrized(module, 'weight'):
            raw_weight = module.parametrizations.weight.original.detach().double()
            raw = float(torch.linalg.matrix_norm(raw_weight.flatten(1), ord=2))
        results.append(LayerNorm(name=layers[module], kind=type(module).__name__, input_shape=shape,
                                 operator_norm=norm, sigma_reshaped=sigma, sigma_raw=raw, iterations=iterations))
    return results


def format_table(norms: list[LayerNorm]) -> str:
    """The LayerNorms as a text table."""
    lines = [f'{"#":>2}  {"layer":16s} {"kind":18s} {"input":>14s} {"||A||_2":>10s} {"sigma(W)":>10s} {"sigma raw":>10s}']
    for i, n in enumerate(norms):
        raw = '' if n.sigma_raw is None else f'{n.sigma_raw:10.4g}'
        lines.append(f'{i + 1:2d}  {n.name:16s} {n.kind:18s} {"x".join(map(str, n.input_shape)):>14s} '
                     f'{n.operator_norm:10.4g} {n.sigma_reshaped:10.4g} {raw:>10s}')
    return '\n'.join(lines)
