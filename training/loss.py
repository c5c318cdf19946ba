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

  * the discriminator constraint `norm`:
      gn / gn1 / gn0   s = f_hat = f / (||grad_x f|| + zeta) with zeta = |f| / 1 / 0 (training/gradnorm.py),
                       for reals and fakes in the D step and for fakes in the G step;
      sn               s = f; the constraint is spectral normalization inside D
                       (its `spectral_norm=True` constructor kwarg, set by the presets for --norm=sn);
      gp1              WGAN-GP: + gp_weight * E[(||grad D(x_mix)|| - 1)^2] on random interpolates
                       x_mix = a * real + (1 - a) * fake, a ~ U[0, 1] per sample;
      gp0              zero-centered GP: + gp_weight * E[||grad D(x_mix)||^2] on the same interpolates;
      r1               + r1_gamma / 2 * E[||grad D(real)||^2] (Mescheder et al. 2018);
      none             s = f, unconstrained.

  * consistency regularization (cr > 0): + cr * E[(s(real) - s(aug(real)))^2], with the same
    label for both and aug a random flip + translation (training/augment.py); s is f_hat under GN.

The D step uses M reals and M fakes generated from gen_z (no gradient into G); the G step
generates from gen_z (its batch may differ, e.g. 2M). Under GN the G step back-propagates through
||grad_x f|| (double backward) unless `fast_g` selects the single-backward path of
training/gradnorm.py, which is exact for a piecewise-linear D and used by default exactly then.
In the G step the gradients left in D's parameters are not meaningful (the loop discards them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_utils import training_stats
from training.augment import consistency_augment
from training.gradnorm import generator_backward_fast, normalize_gradient, per_sample_norm

#----------------------------------------------------------------------------

LOSSES = ('hinge', 'ns', 'ns-nosigmoid', 'wasserstein')
NORMS = ('gn', 'gn1', 'gn0', 'sn', 'gp1', 'gp0', 'r1', 'none')
GN_ZETAS = {'gn': 'abs', 'gn1': 1, 'gn0': 0}


def check_choice(kind: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f'unknown {kind} "{value}"; valid: {", ".join(choices)}')


def _bce_on_scores(scores: torch.Tensor, target: float) -> torch.Tensor:
    p = ((scores + 1) / 2).clamp(0, 1)
    return F.binary_cross_entropy(p, torch.full_like(p, target), reduction='none')


def d_loss_terms(loss: str, real: torch.Tensor, fake: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample D loss on real and on fake scores (see the table in the module docstring)."""
    check_choice('loss', loss, LOSSES)
    if loss == 'hinge':
        return F.relu(1 - real), F.relu(1 + fake)
    if loss == 'ns':
        return F.softplus(-real), F.softplus(fake)
    if loss == 'ns-nosigmoid':
        return _bce_on_scores(real, 1.0), _bce_on_scores(fake, 0.0)
    return -real, fake


def g_loss_terms(loss: str, fake: torch.Tensor) -> torch.Tensor:
    """Per-sample G loss on fake scores (see the table in the module docstring)."""
    check_choice('loss', loss, LOSSES)
    if loss == 'ns':
        return F.softplus(-fake)
    if loss == 'ns-nosigmoid':
        return _bce_on_scores(fake, 1.0)
    return -fake  # hinge and wasserstein


def input_gradient_norm(D: torch.nn.Module, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Per-sample ||grad_x D(x, c)||, differentiable w.r.t. D's parameters (for gradient penalties)."""
    x = x.detach().requires_grad_(True)
    f = D(x, c)
    grad, = torch.autograd.grad(f.sum(), x, create_graph=True)
    return per_sample_norm(grad, f)

#----------------------------------------------------------------------------


class GANLoss:
    """One D step or one G step of a GAN with a configurable adversarial loss, D constraint and CR."""

    def __init__(self,
        G: torch.nn.Module,             # Generator, called as G(z, c).
        D: torch.nn.Module,             # Discriminator, called as D(img, c) -> [N, 1].
        loss: str = 'hinge',            # Adversarial loss: hinge, ns, ns-nosigmoid, wasserstein.
        norm: str = 'gn',               # D constraint: gn, gn1, gn0, sn, gp1, gp0, r1, none.
        gp_weight: float = 10.0,        # Weight of the gp1 / gp0 penalties (lambda).
        r1_gamma: float = 10.0,         # R1 weight gamma (the penalty is gamma / 2 * E||grad||^2).
        cr: float = 0.0,                # Consistency regularization weight (paper: 5), 0 = off.
        fast_g: bool | None = None,     # GN generator step by one first-order backward; None = iff D.is_piecewise_linear.
    ) -> None:
        check_choice('loss', loss, LOSSES)
        check_choice('norm', norm, NORMS)
        self.G = G
        self.D = D
        self.loss = loss
        self.norm = norm
        self.gp_weight = gp_weight
        self.r1_gamma = r1_gamma
        self.cr = cr
        self.fast_g = bool(getattr(D, 'is_piecewise_linear', False)) if fast_g is None else bool(fast_g)

    def scores(self, img: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The score the adversarial loss sees (f_hat under GN, else the raw D output) and, under GN, ||grad_x f||."""
        if self.norm in GN_ZETAS:
            out = normalize_gradient(self.D, img, c, zeta=GN_ZETAS[self.norm])
            return out.f_hat, out.grad_norm
        return self.D(img, c), None

    def accumulate_gradients(self, phase: str, real_img: torch.Tensor | None, real_c: torch.Tensor | None,
                             gen_z: torch.Tensor, gen_c: torch.Tensor, gain: float = 1.0) -> None:
        """Compute this step's loss on the given batch and back-propagate gain * loss (gradients accumulate;
        gain = 1 / rounds averages accumulation rounds).

        phase 'D': reals real_img/real_c (float in [-1, 1]; one-hot labels) and fakes G(gen_z, gen_c).
        phase 'G': fakes G(gen_z, gen_c) only; real_img and real_c are unused.
        """
        if phase == 'D':
            self._discriminator_step(real_img, real_c, gen_z, gen_c, gain)
        elif phase == 'G':
            self._generator_step(gen_z, gen_c, gain)
        else:
            raise ValueError(f'unknown phase "{phase}"; valid: D, G')

    def _discriminator_step(self, real_img: torch.Tensor, real_c: torch.Tensor, gen_z: torch.Tensor,
                            gen_c: torch.Tensor, gain: float) -> None:
        with torch.no_grad():
            gen_img = self.G(gen_z, gen_c)
        real_scores, real_grad_norm = self.scores(real_img, real_c)
        fake_scores, fake_grad_norm = self.scores(gen_img, gen_c)
        real_terms, fake_terms = d_loss_terms(self.loss, real_scores, fake_scores)
        loss = real_terms.mean() + fake_terms.mean()
        training_stats.report('Loss/scores/real', real_scores)
        training_stats.report('Loss/scores/fake', fake_scores)
        training_stats.report('Loss/D/real', real_terms)
        training_stats.report('Loss/D/fake', fake_terms)
        if real_grad_norm is not None:
            training_stats.report('Loss/grad_norm', torch.cat([real_grad_norm, fake_grad_norm]))

        if self.cr > 0:
            augmented_scores, _ = self.scores(consistency_augment(real_img), real_c)
            cr_terms = (real_scores - augmented_scores).square()
            loss = loss + self.cr * cr_terms.mean()
            training_stats.report('Loss/cr', cr_terms)

        if self.norm in ('gp1', 'gp0'):
            if gen_img.shape[0] != real_img.shape[0]:
                raise ValueError(f'{self.norm} interpolates reals and fakes: got {real_img.shape[0]} reals '
                                 f'but {gen_img.shape[0]} fakes')
            alpha = torch.rand([real_img.shape[0]] + [1] * (real_img.ndim - 1),
                               device=real_img.device, dtype=real_img.dtype)
            mixed = alpha * real_img + (1 - alpha) * gen_img
            grad_norm = input_gradient_norm(self.D, mixed, real_c)  # Interpolates keep the real labels.
            center = 1.0 if self.norm == 'gp1' else 0.0
            penalty = self.gp_weight * (grad_norm - center).square()
            loss = loss + penalty.mean()
            training_stats.report('Loss/grad_norm', grad_norm)
            training_stats.report('Loss/penalty', penalty)
        elif self.norm == 'r1':
            grad_norm = input_gradient_norm(self.D, real_img, real_c)
            penalty = self.r1_gamma / 2 * grad_norm.square()
            loss = loss + penalty.mean()
            training_stats.report('Loss/grad_norm', grad_norm)
            training_stats.report('Loss/penalty', penalty)

        training_stats.report('Loss/D/loss', loss)
        (loss * gain).backward()

    def _generator_step(self, gen_z: torch.Tensor, gen_c: torch.Tensor, gain: float) -> None:
        gen_img = self.G(gen_z, gen_c)
        if self.norm in GN_ZETAS and self.fast_g:
            loss, _ = generator_backward_fast(self.D, gen_img, gen_c, zeta=GN_ZETAS[self.norm],
                                              loss_fn=lambda s: g_loss_terms(self.loss, s).mean() * gain)
            loss = loss / gain
        else:
            loss = g_loss_terms(self.loss, self.scores(gen_img, gen_c)[0]).mean()
            (loss * gain).backward()
        training_stats.report('Loss/G/loss', loss)
