"""GAN losses: adversarial loss x discriminator constraint x consistency regularization.

`GANLoss` computes one training step's loss for D or for G and back-propagates it. It composes

  * the adversarial loss on the discriminator score s (written per sample; the step loss is the
    batch mean, real and fake terms added):

        loss            D, real             D, fake             G
        hinge           relu(1 - s)         relu(1 + s)         -s
        ns              softplus(-s)        softplus(s)         softplus(-s)     (BCE on sigmoid(s))
        ns-nosigmoid    -log p              -log(1 - p)         -log p           p = (s + 1) / 2
        wasserstein     -s                  s                   -s

    'ns-nosigmoid' reads a GN score s in [-1, 1] directly as a probability (the GN-GAN release's
    BCE on (f_hat + 1) / 2). With an unbounded score (other norms) p is clipped to [0, 1], so the
    loss saturates outside [-1, 1], and the logs are clamped at -100 as torch's BCE does. With GN
    the hinge and the Wasserstein losses have the same gradients, since |f_hat| <= 1.

  * the discriminator constraint `norm`, one entry of the table CONSTRAINTS:
      gn / gn1 / gn0   s = f_hat = f / (||grad_x f|| + zeta) with zeta = |f| / 1 / 0 (training/step/gradnorm.py),
                       for reals and fakes in the D step and for fakes in the G step;
      sn               s = f; the constraint is spectral normalization inside D
                       (its `spectral_norm=True` constructor kwarg, which training/recipes/configs.py sets);
      gp1              WGAN-GP: + gp_weight * E[(||grad D(x_mix)|| - 1)^2] on random interpolates
                       x_mix = a * real + (1 - a) * fake, a ~ U[0, 1] per sample;
      gp0              zero-centered GP: + gp_weight * E[||grad D(x_mix)||^2] on the same interpolates;
      r1               + r1_gamma / 2 * E[||grad D(real)||^2] (Mescheder et al. 2018);
      none             s = f, unconstrained.
    A new constraint is one entry of CONSTRAINTS (plus, for a penalty, its function).

  * consistency regularization (cr > 0): + cr * E[(s(real) - s(aug(real)))^2], with the same
    label for both and aug a random flip + translation (training/step/augment.py); s is f_hat under GN.

  * augmentation of D's inputs (`augment_kwargs`, train.py --aug; training/step/ada.py): D sees A(x), the fakes then
    the reals of the D step and the fakes of the G step each through A with draws of its own, as NVIDIA's loss. GN
    normalizes D at its input, the augmented image; for fixed draws A is affine in x, and GN's fast G step and affine
    D step stay exact (docs/gradnorm.md). The penalties (R1, the GPs) differentiate D(A(x)) w.r.t. x, the image before
    augmentation, as NVIDIA's R1; CR compares D on the augmented reals with D on CR's copy of them. The sign of the
    score on the reals goes to ADA's statistic and to 'Loss/signs/real'.

The D step uses M reals and M fakes generated from gen_z (no gradient into G); the G step
generates from gen_z (its batch may differ, e.g. 2M). Where D treats every sample on its own
(`D.is_sample_independent`: no batch statistics, no minibatch stddev), the reals, the fakes and
CR's augmented reals may go through D in one call on their concatenation (one GN double backward
instead of two or three: half the kernel launches on a GPU), which gives the same scores and
gradients; with spectral normalization the power iteration then also advances once per D step
instead of once per call. It is the default on CUDA; on a CPU, where launches cost nothing and
the larger batch measured slower, separate calls are. Under GN the G step back-propagates through
||grad_x f|| (double backward) unless `fast_g` selects the single-backward path of
training/step/gradnorm.py, which is exact for a piecewise-linear D and used by default exactly then (asked for by
name with any other D, e.g. a smooth activation's, it is refused; `exact_path_note` says which paths a run takes).
(The G step runs with D's parameters frozen, requires_grad False, so it leaves no D gradients.)
In the D step, a piecewise-linear, sample-independent D built of conv and linear layers takes GN's
f in its affine form (`linear_d`; training/step/gradnorm.py): the same gradients, with the second
backward through the first backward's graph only (a third fewer convolutions per GN D step). The
identity, which does not depend on the arithmetic, is measured in float32 on the first D step's
reals (relative error below 1e-3) before it is relied on; where it fails, the loss warns once and
differentiates plainly. It is the default where no autocast runs (fp32, tf32): under bf16 or fp16 the affine
form takes all of D's gradient from the second backward through the first backward's rounded graph,
which some kernel sets (oneDNN with AMX) round far worse than the plain double backward, so the D
step differentiates plainly there unless `linear_d=True` asks otherwise (docs/precision.md).

Gradient norms are those w.r.t. the image D is defined on: a progressive StyleGAN D works at the
active resolution but, as in StyleGAN v1, stands for a D of the full-resolution image, and
declares the exact factor between the two norms (`input_grad_scale`, 1 for every other D); GN's
norm, R1 and the gradient penalties use the scaled norm.

Precision (`precision`, training/step/precision.py): 'fp32' and 'tf32' run everything in float32;
'bf16' and 'fp16' run the forward passes of G and D under torch.autocast (convolutions and
matmuls, and so the custom ops that follow them, in that dtype), while D's output, the input
gradient, GN's norm and division, the penalties and the losses are float32. fp16 needs loss
scaling: the caller passes the scale (e.g. torch.amp.GradScaler's) as `gain` and unscales before
the optimizer step (training/step/updater.py).
Operators: the networks run on PyTorch's own convolutions, ReLUs and pooling, except in the passes that
are differentiated twice (GN's normalize_gradient, the gradient penalties' input gradients), which open
`conv2d_gradfix.higher_order_gradients()` so that their layers record the autograd Functions of
ops/conv2d_gradfix and ops/relu_pool_gradfix (same values, cheap double backward). The plain and SN
D steps and the G steps without a second derivative (the fast GN G step, every G step without GN)
take no Python per layer in their backward passes.
StyleGAN2 (training/networks/stylegan2.py; NVIDIA's StyleGAN2-ADA loss, training/loss.py there): with
`style_mixing_prob` > 0 G runs as its mapping and synthesis, and in every G call (D step and G step, as
theirs) the styles from a random crossover layer on, drawn from 1 .. num_ws - 1, come from a second latent
with that probability (one coin and crossover per batch, applied on the device as a mask). Path length
regularization (`pl_weight` > 0): on the first N / pl_batch_shrink latents of a G step,

    g_i = J_i^T y for each style w_i, y ~ N(0, I) / sqrt(H W) of the image's shape,   a = sqrt(mean_i ||g_i||^2),
    pl_mean <- lerp(pl_mean, mean a, pl_decay),   + pl_weight * E[(a - pl_mean)^2]   (the new pl_mean differentiated)

Lazy regularization, NVIDIA's phases: with an interval k > 1 the path length term (G, `G_reg_interval`) and the
constraint's penalty (D, `D_reg_interval`: R1) run at every k-th step as an optimizer step of their own, weighted by
k, after the step's main loss ('main', then 'reg'); with k = 1 both are one loss and one optimizer step ('both').
`phases(net, step)` lists a step's phases (its caller runs an optimizer step for each, `set_phase` before it, and
keys its captured graphs by them).
pl_mean is a device tensor of the loss (`state_tensors`), one per process as NVIDIA's (each process averages its own
latents); snapshots keep it (`state_dict`), so a resumed run goes on with it where NVIDIA's restarts it at 0.
The networks' memory format is set where they are built for a run (Precision.lay_out), not here.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from typing import Callable

import torch
import torch.nn.functional as F

import dnnlib
from ops import conv2d_gradfix
from torch_utils import training_stats
from training.step.ada import STATE_KEYS as AUGMENT_STATE_KEYS, Augmentation
from training.step.augment import consistency_augment
from training.step.gradnorm import (affine_form_error, generator_backward_fast, linearizable_layers, normalize_gradient,
                               per_sample_norm)
from training.step.precision import Precision

#----------------------------------------------------------------------------

AFFINE_CHECK_SAMPLES = 4       # Samples of the first batch on which D's affine form is checked, in float64.
AFFINE_CHECK_TOLERANCE = 1e-9  # Largest relative error in float64 (rounding gives ~1e-15; a missed term ~1e-1).
LOSS_STATE_KEYS = ('pl_mean',) + AUGMENT_STATE_KEYS  # What GANLoss.state_dict may hold: float scalars (--aug's too).
PHASES = ('both', 'main', 'reg')  # A step's loss with its regularizer, without it, the regularizer alone (phases()).


def _bce_on_scores(scores: torch.Tensor, target: float) -> torch.Tensor:
    p = ((scores + 1) / 2).clamp(0, 1)
    return F.binary_cross_entropy(p, torch.full_like(p, target), reduction='none')


# Per-sample D loss on (real scores, fake scores) and G loss on fake scores, per --loss (the module docstring's table).
D_LOSS_TERMS = {
    'hinge':        lambda real, fake: (F.relu(1 - real), F.relu(1 + fake)),
    'ns':           lambda real, fake: (F.softplus(-real), F.softplus(fake)),
    'ns-nosigmoid': lambda real, fake: (_bce_on_scores(real, 1.0), _bce_on_scores(fake, 0.0)),
    'wasserstein':  lambda real, fake: (-real, fake),
}
G_LOSS_TERMS = {
    'hinge':        lambda fake: -fake,
    'ns':           lambda fake: F.softplus(-fake),
    'ns-nosigmoid': lambda fake: _bce_on_scores(fake, 1.0),
    'wasserstein':  lambda fake: -fake,
}
LOSSES = tuple(D_LOSS_TERMS)


def d_loss_terms(loss: str, real: torch.Tensor, fake: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample D loss on real and on fake scores."""
    return D_LOSS_TERMS[loss](real, fake)


def g_loss_terms(loss: str, fake: torch.Tensor) -> torch.Tensor:
    """Per-sample G loss on fake scores."""
    return G_LOSS_TERMS[loss](fake)


def input_gradient_norm(D: Callable[..., torch.Tensor], x: torch.Tensor, c: torch.Tensor,
                        grad_norm_scale: float = 1.0) -> torch.Tensor:
    """Per-sample ||grad_x D(x, c)|| * grad_norm_scale, differentiable w.r.t. D's parameters (gradient penalties)."""
    x = x.detach().requires_grad_(True)
    with conv2d_gradfix.higher_order_gradients():  # The norm is differentiated again.
        f = D(x, c)
        grad, = torch.autograd.grad(f.sum(), x, create_graph=True)
    return per_sample_norm(grad, f) * grad_norm_scale


def interpolate_penalty(loss: GANLoss, real_img: torch.Tensor, real_c: torch.Tensor, gen_img: torch.Tensor,
                        center: float) -> tuple[torch.Tensor, torch.Tensor]:
    """gp_weight * (||grad D(x_mix)|| - center)^2 per sample, x_mix = a * real + (1 - a) * fake, a ~ U[0, 1] per
    sample (WGAN-GP: center 1; zero-centered GP: 0). Returns (penalty, ||grad||)."""
    if gen_img.shape[0] != real_img.shape[0]:
        raise ValueError(f'{loss.norm} interpolates reals and fakes: got {real_img.shape[0]} reals '
                         f'but {gen_img.shape[0]} fakes')
    alpha = torch.rand([real_img.shape[0]] + [1] * (real_img.ndim - 1), device=real_img.device, dtype=real_img.dtype)
    mixed = alpha * real_img + (1 - alpha) * gen_img
    grad_norm = input_gradient_norm(loss.discriminate, mixed, real_c, loss.input_grad_scale())  # With the real labels.
    return loss.gp_weight * (grad_norm - center).square(), grad_norm


def r1_penalty(loss: GANLoss, real_img: torch.Tensor, real_c: torch.Tensor, gen_img: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """r1_gamma / 2 * ||grad D(real)||^2 per sample (Mescheder et al. 2018). Returns (penalty, ||grad||)."""
    grad_norm = input_gradient_norm(loss.discriminate, real_img, real_c, loss.input_grad_scale())
    return loss.r1_gamma / 2 * grad_norm.square(), grad_norm


@dataclasses.dataclass(frozen=True)
class Constraint:
    """How one --norm constrains D (see the module docstring)."""
    gn_zeta: str | float | None = None  # GN's zeta: the loss sees f / (||grad_x f|| + zeta); None: the raw f.
    spectral_norm: bool = False         # D is built with spectral normalization (its spectral_norm kwarg).
    penalty: Callable | None = None     # Extra D-step term (loss, real_img, real_c, gen_img) -> (per sample, ||grad||).
    penalty_on_fakes: bool = False      # The penalty reads gen_img (else it gets None in a 'reg' phase).
    lazy: bool = False                  # The penalty may run every k-th D step only (lazy regularization, StyleGAN2).


CONSTRAINTS = {
    'gn':   Constraint(gn_zeta='abs'),
    'gn1':  Constraint(gn_zeta=1),
    'gn0':  Constraint(gn_zeta=0),
    'sn':   Constraint(spectral_norm=True),
    'gp1':  Constraint(penalty=functools.partial(interpolate_penalty, center=1.0), penalty_on_fakes=True),
    'gp0':  Constraint(penalty=functools.partial(interpolate_penalty, center=0.0), penalty_on_fakes=True),
    'r1':   Constraint(penalty=r1_penalty, lazy=True),
    'none': Constraint(),
}
NORMS = tuple(CONSTRAINTS)


@dataclasses.dataclass(frozen=True)
class LossScore:
    """The output of D that the loss of constraint `norm` sees: f_hat = f / (||grad_x f|| + zeta(f)) under GN, the raw f
    otherwise; called as score(D, x, c, grad_norm_scale) on an x that requires grad. What the L_D metrics differentiate
    (metrics/lipschitz.py's DScore), handed to them by the training code so that metrics/ imports nothing of training/."""
    norm: str  # A --norm (CONSTRAINTS).

    def __post_init__(self) -> None:
        dnnlib.util.check_choice('norm', self.norm, NORMS)

    def __call__(self, D: Callable[..., torch.Tensor], x: torch.Tensor, c: torch.Tensor,
                 grad_norm_scale: float = 1.0) -> torch.Tensor:
        zeta = CONSTRAINTS[self.norm].gn_zeta
        if zeta is None:
            return D(x, c)
        return normalize_gradient(D, x, c, zeta=zeta, grad_norm_scale=grad_norm_scale).f_hat


#----------------------------------------------------------------------------


class GANLoss:
    """One D step or one G step of a GAN with a configurable adversarial loss, D constraint and CR."""

    def __init__(self,
        G: torch.nn.Module,                 # Generator, called as G(z, c).
        D: torch.nn.Module,                 # Discriminator, called as D(img, c) -> [N, 1].
        loss: str = 'hinge',                # Adversarial loss: hinge, ns, ns-nosigmoid, wasserstein.
        norm: str = 'gn',                   # D constraint: gn, gn1, gn0, sn, gp1, gp0, r1, none.
        gp_weight: float = 10.0,            # Weight of the gp1 / gp0 penalties (lambda).
        r1_gamma: float = 10.0,             # R1 weight gamma (the penalty is gamma / 2 * E||grad||^2).
        cr: float = 0.0,                    # Consistency regularization weight (paper: 5), 0 = off.
        fast_g: bool | None = None,         # GN generator step by one first-order backward; None = iff D.is_piecewise_linear.
        fuse_d_calls: bool | None = None,   # Reals, fakes (and CR's copies) in one D call; None = iff D.is_sample_independent, on CUDA.
        linear_d: bool | None = None,       # GN D step, f in affine form; None = iff D qualifies and no autocast runs.
        precision: str | Precision = 'fp32', # Arithmetic of the networks: fp32, tf32, bf16, fp16 (see the module docstring).
        style_mixing_prob: float = 0.0,     # StyleGAN2 G (mapping + synthesis): probability of mixing two latents' styles.
        pl_weight: float = 0.0,             # StyleGAN2 G: path length regularization weight (NVIDIA: 2), 0 = off.
        pl_decay: float = 0.01,             # Decay of the path length average pl_mean.
        pl_batch_shrink: int = 2,           # The path length term sees batch / pl_batch_shrink latents.
        G_reg_interval: int = 1,            # The path length term at every this-many-th G step, own phase (NVIDIA: 4).
        D_reg_interval: int = 1,            # The constraint's penalty (R1) at every this-many-th D step, own phase (NVIDIA: 16).
        augment_kwargs: dict | None = None, # D's inputs augmented: training/step/ada.py's Augmentation kwargs.
    ) -> None:
        self.G = G
        self.D = D
        self.loss = loss
        self.norm = norm
        self.constraint = CONSTRAINTS[norm]
        self.gp_weight = gp_weight
        self.r1_gamma = r1_gamma
        self.cr = cr
        piecewise_linear = bool(getattr(D, 'is_piecewise_linear', False))
        if fast_g and not piecewise_linear and self.constraint.gn_zeta is not None:
            raise ValueError(f'fast_g needs a piecewise-linear D (its Hessian vanishes); {type(D).__name__} is not '
                             f'(e.g. a smooth activation): leave fast_g to its default, the exact double backward')
        self.fast_g = piecewise_linear if fast_g is None else bool(fast_g)
        self.precision = precision if isinstance(precision, Precision) else Precision(precision)
        param = next(D.parameters(), None)
        device_type = None if param is None else param.device.type
        if fuse_d_calls is None:  # One call halves a GPU D step's kernel launches; on a CPU it gains nothing.
            fuse_d_calls = bool(getattr(D, 'is_sample_independent', False)) and device_type == 'cuda'
        self.fuse_d_calls = bool(fuse_d_calls)
        # The affine form by default without autocast only: under bf16/fp16 autocast all of its D gradient comes
        # from the second backward through the first backward's rounded graph (docs/precision.md: far off with AMX).
        affine = self.precision.autocast_dtype is None if linear_d is None else bool(linear_d)
        self.bias_layers = linearizable_layers(D) if affine and self.constraint.gn_zeta is not None else None
        if linear_d and self.bias_layers is None:
            raise ValueError(f'linear_d needs GN and a D that is piecewise linear, sample-independent and built of '
                             f'conv and linear layers; got norm {norm} and {type(D).__name__}')
        self.linear_d_checked = False  # Set once linearization_error has been measured on a batch.
        if G_reg_interval < 1 or D_reg_interval < 1 or pl_batch_shrink < 1:
            raise ValueError('G_reg_interval, D_reg_interval and pl_batch_shrink must be at least 1')
        if (style_mixing_prob > 0 or pl_weight > 0) and not (hasattr(G, 'mapping') and hasattr(G, 'synthesis')):
            raise ValueError(f'style mixing and path length regularization need a G made of mapping and synthesis, '
                             f'not {type(G).__name__}')
        self.style_mixing_prob = style_mixing_prob
        self.pl_weight, self.pl_decay, self.pl_batch_shrink = pl_weight, pl_decay, pl_batch_shrink
        self.reg_intervals = dict(G=G_reg_interval, D=D_reg_interval)
        self.pl_mean = torch.zeros([], device=None if param is None else param.device)
        self.augment = None if augment_kwargs is None else Augmentation(**augment_kwargs, device=self.pl_mean.device)
        self._phase = dict(G='both', D='both')  # What accumulate_gradients computes (set_phase).

    def exact_path_note(self) -> str | None:
        """One line for the run's log when GN takes its exact, slower paths because D is not piecewise linear; else None."""
        if self.constraint.gn_zeta is None or getattr(self.D, 'is_piecewise_linear', False):
            return None
        return (f'GN: {type(self.D).__name__} is not piecewise linear: the G step differentiates ||grad f|| exactly '
                f'(no fast first-order step) and the D step plainly (no affine form)')

    def phases(self, net: str, step: int) -> tuple[str, ...]:
        """The phases of the step of `net` ('D' or 'G') at G step `step`, an optimizer step each, in order: ('both',)
        where its regularizer (path length for G, the constraint's penalty for D) is not lazy or absent, else
        ('main', 'reg') at every reg_interval-th step and ('main',) between."""
        regularized = self.pl_weight > 0 if net == 'G' else self.constraint.penalty is not None
        if self.reg_intervals[net] == 1 or not regularized:
            return ('both',)
        return ('main', 'reg') if step % self.reg_intervals[net] == 0 else ('main',)

    def set_phase(self, net: str, phase: str) -> None:
        """What the following accumulate_gradients calls of `net` compute: one of PHASES."""
        dnnlib.util.check_choice('phase', phase, PHASES)
        self._phase[net] = phase

    def state_tensors(self) -> list[torch.Tensor]:
        """Tensors the steps change besides the networks and optimizers (the path length average, ADA's statistic)."""
        return [self.pl_mean] + ([] if self.augment is None else self.augment.state_tensors())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The state by name, on the CPU, for a snapshot: pl_mean, and with --aug the augmentation's p and statistic."""
        augment = {} if self.augment is None else self.augment.state_dict()
        return dict(pl_mean=self.pl_mean.detach().cpu().clone(), **augment)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Continue from a snapshot's state_dict (in place: captured CUDA graphs keep their tensors); a run with --aug
        from a snapshot without it keeps its starting p."""
        self.pl_mean.copy_(state['pl_mean'])
        if self.augment is not None and all(key in state for key in AUGMENT_STATE_KEYS):
            self.augment.load_state_dict(state)

    def run_G(self, z: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """G(z, c) in the loss's precision, with style mixing where asked; the images come back in float32."""
        if self.style_mixing_prob == 0:
            return self.precision.run(self.G, z, c)
        return self.run_G_styles(z, c)[0]

    def run_G_styles(self, z: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(images, float32 under autocast; styles ws) of a mapping + synthesis G, the styles mixed with a second
        latent's from a random crossover on with probability style_mixing_prob (device ops only, no host read)."""
        with self.precision.autocast(z.device.type):
            ws = self.G.mapping(z, c)
            if self.style_mixing_prob > 0:
                num_ws = ws.shape[1]
                cutoff = torch.randint(1, num_ws, [], device=ws.device)
                cutoff = cutoff.where(torch.rand([], device=ws.device) < self.style_mixing_prob, num_ws)
                mixed = self.G.mapping(torch.randn_like(z), c, skip_w_avg_update=True)
                ws = torch.where((torch.arange(num_ws, device=ws.device) >= cutoff).view(1, -1, 1), mixed, ws)
            img = self.G.synthesis(ws)
        return img if self.precision.autocast_dtype is None else img.to(torch.float32), ws

    def run_D(self, img: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """D(img, c) in the loss's precision; the scores come back in float32."""
        return self.precision.run(self.D, img, c)

    def augmented(self, img: torch.Tensor) -> torch.Tensor:
        """What D sees of `img`: A(img) with draws of its own under --aug, else img."""
        return img if self.augment is None else self.augment(img)

    def discriminate(self, img: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """D(A(img), c): the penalties differentiate it w.r.t. the image before augmentation, as NVIDIA's R1."""
        return self.run_D(self.augmented(img), c)

    def input_grad_scale(self) -> float:
        """||grad|| w.r.t. the image D is defined on, per unit of ||grad|| w.r.t. its actual input (see module docstring)."""
        return getattr(self.D, 'input_grad_scale', 1.0)

    def scores(self, img: torch.Tensor, c: torch.Tensor, linear_d: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The score the adversarial loss sees (f_hat under GN, else the raw D output) and, under GN, ||grad_x f||.

        linear_d: take GN's f in its affine form where D qualifies (the D step; same values and gradients)."""
        if self.constraint.gn_zeta is not None:
            out = normalize_gradient(self.run_D, img, c, zeta=self.constraint.gn_zeta, grad_norm_scale=self.input_grad_scale(),
                                     bias_layers=self.bias_layers if linear_d else None)
            return out.f_hat, out.grad_norm
        return self.run_D(img, c), None

    def accumulate_gradients(self, net: str, real_img: torch.Tensor | None, real_c: torch.Tensor | None,
                             gen_z: torch.Tensor, gen_c: torch.Tensor, gain: float | torch.Tensor = 1.0) -> None:
        """Compute the loss of a D step or a G step on the given batch and call backward() on loss * gain
        (gradients accumulate).

        net 'D': reals real_img/real_c (float in [-1, 1]; one-hot labels) and fakes G(gen_z, gen_c).
        net 'G': fakes G(gen_z, gen_c) only; real_img and real_c are unused.
        gain: 1 / rounds for gradient accumulation over rounds, times the loss scale for fp16 (a
        tensor, e.g. GradScaler.scale(ones), avoids reading the scale back from the GPU).
        """
        if net == 'D':
            self._discriminator_step(real_img, real_c, gen_z, gen_c, gain)
        elif net == 'G':
            self._generator_step(gen_z, gen_c, gain)
        else:
            raise ValueError(f'unknown network "{net}"; valid: D, G')

    def _batch_scores(self, imgs: list[torch.Tensor], labels: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """`scores` of several batches: one D call on their concatenation when D allows it, else one call each."""
        if not self.fuse_d_calls:
            return [self.scores(img, c, linear_d=True) for img, c in zip(imgs, labels)]
        sizes = [img.shape[0] for img in imgs]
        scores, grad_norm = self.scores(torch.cat(imgs), torch.cat(labels), linear_d=True)
        grad_norms = [None] * len(imgs) if grad_norm is None else grad_norm.split(sizes)
        return list(zip(scores.split(sizes), grad_norms))

    def _discriminator_step(self, real_img: torch.Tensor, real_c: torch.Tensor, gen_z: torch.Tensor,
                            gen_c: torch.Tensor, gain: float | torch.Tensor) -> None:
        phase = self._phase['D']
        gen_img = None
        if phase != 'reg' or self.constraint.penalty_on_fakes:
            with torch.no_grad():
                gen_img = self.run_G(gen_z, gen_c)
        if phase == 'reg':  # The penalty alone, weighted by its interval.
            penalty = self._report_penalty(real_img, real_c, gen_img)
            (penalty * self.reg_intervals['D'] * gain).backward()
            return
        seen_gen = self.augmented(gen_img)  # Fakes first, then reals, each with its own draws (NVIDIA's order).
        seen_real = self.augmented(real_img)
        if self.bias_layers is not None and not self.linear_d_checked:
            self._check_linear_d(seen_real, real_c)
        imgs, labels = [seen_real, seen_gen], [real_c, gen_c]
        if self.cr > 0:  # Under --aug: CR's flip and shift of the augmented reals, compared with D on them.
            imgs.append(consistency_augment(seen_real))
            labels.append(real_c)  # The augmented copy keeps its real label.
        results = self._batch_scores(imgs, labels)
        (real_scores, real_grad_norm), (fake_scores, fake_grad_norm) = results[:2]
        real_terms, fake_terms = d_loss_terms(self.loss, real_scores, fake_scores)
        loss = real_terms.mean() + fake_terms.mean()
        training_stats.report('Loss/scores/real', real_scores)
        training_stats.report('Loss/scores/fake', fake_scores)
        training_stats.report('Loss/D/real', real_terms)
        training_stats.report('Loss/D/fake', fake_terms)
        if self.augment is not None:
            self.augment.record(real_scores)  # ADA's statistic: the sign of D (GN: of f_hat, f's) on the reals.
            training_stats.report('Loss/signs/real', real_scores.sign())
        if real_grad_norm is not None:
            training_stats.report('Loss/grad_norm', torch.cat([real_grad_norm, fake_grad_norm]))

        if self.cr > 0:
            cr_terms = (real_scores - results[2][0]).square()
            loss = loss + self.cr * cr_terms.mean()
            training_stats.report('Loss/cr', cr_terms)

        if self.constraint.penalty is not None and phase == 'both':
            loss = loss + self._report_penalty(real_img, real_c, gen_img)

        training_stats.report('Loss/D/loss', loss)
        (loss * gain).backward()

    def _report_penalty(self, real_img: torch.Tensor, real_c: torch.Tensor, gen_img: torch.Tensor | None) -> torch.Tensor:
        """The constraint's penalty, averaged over the batch (its per-sample values and norms reported)."""
        penalty, grad_norm = self.constraint.penalty(self, real_img, real_c, gen_img)
        training_stats.report('Loss/grad_norm', grad_norm)
        training_stats.report('Loss/penalty', penalty)
        return penalty.mean()

    def _check_linear_d(self, img: torch.Tensor, c: torch.Tensor) -> None:
        """Measure the affine identity once, on a float64 copy of D with random biases (gradnorm.affine_form_error)
        and a few of the batch's samples, and fall back to the plain double backward if it does not hold."""
        error = affine_form_error(self.D, img[:AFFINE_CHECK_SAMPLES], c[:AFFINE_CHECK_SAMPLES])
        if not error <= AFFINE_CHECK_TOLERANCE:
            warnings.warn(f'{type(self.D).__name__}: D(x) differs from its affine form <grad, x> + biases by '
                          f'{error:.2g} of its largest term in float64 (tolerance {AFFINE_CHECK_TOLERANCE:g}); the GN D '
                          f'step differentiates plainly instead (slower, same gradients)')
            self.bias_layers = None
        self.linear_d_checked = True

    def _generator_step(self, gen_z: torch.Tensor, gen_c: torch.Tensor, gain: float | torch.Tensor) -> None:
        phase = self._phase['G']
        if phase != 'reg':
            gen_img = self.augmented(self.run_G(gen_z, gen_c))  # GN normalizes D at what it sees, A(G(z)).
            if self.constraint.gn_zeta is not None and self.fast_g:
                loss, _ = generator_backward_fast(self.run_D, gen_img, gen_c, zeta=self.constraint.gn_zeta,
                                                  loss_fn=lambda s: g_loss_terms(self.loss, s).mean(),
                                                  grad_norm_scale=self.input_grad_scale(), gain=gain)
            else:
                loss = g_loss_terms(self.loss, self.scores(gen_img, gen_c)[0]).mean()
                (loss * gain).backward()
            training_stats.report('Loss/G/loss', loss)
        if self.pl_weight > 0 and phase != 'main':  # 'reg': weighted by its interval; 'both': the interval is 1.
            self._path_length_backward(gen_z, gen_c, gain * self.reg_intervals['G'])

    def _path_length_backward(self, gen_z: torch.Tensor, gen_c: torch.Tensor, gain: float | torch.Tensor) -> None:
        """Path length regularization (module docstring) on the first N / pl_batch_shrink latents, back-propagated."""
        n = max(1, gen_z.shape[0] // self.pl_batch_shrink)
        img, ws = self.run_G_styles(gen_z[:n], gen_c[:n])
        noise = torch.randn_like(img) / math.sqrt(img.shape[2] * img.shape[3])
        grads, = torch.autograd.grad((img * noise).sum(), ws, create_graph=True)
        lengths = grads.to(torch.promote_types(grads.dtype, torch.float32)).square().sum(dim=2).mean(dim=1).sqrt()
        pl_mean = self.pl_mean.to(lengths.dtype).lerp(lengths.mean(), self.pl_decay)  # Differentiated, as NVIDIA's.
        self.pl_mean.copy_(pl_mean.detach())
        penalty = (lengths - pl_mean).square()
        training_stats.report('Loss/pl_penalty', penalty)
        (penalty.mean() * self.pl_weight * gain).backward()
