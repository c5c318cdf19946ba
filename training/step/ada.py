"""What D sees under --aug: its inputs augmented (training/step/augment.py), and ADA's p, kept as NVIDIA's loop does.

    noaug     D sees the images as they are (the loss holds no Augmentation)
    fixed     NVIDIA's AugmentPipe of the pipeline --augpipe, at the constant probability p (--p)
    ada       the same pipe, its p adjusted after every `interval`-th D step by NVIDIA's rule (Karras et al. 2020, and
              their training loop):
                  r_t = the mean sign of D's outputs on the reals since the last adjustment, all processes together
                        (GN: the sign of f_hat, which is f's)
                  p  <- max(p + sign(r_t - target) * n / (ada_kimg * 1000), 0)
              n the real images of those D steps (NVIDIA's batch * interval; here also where progressive growing changes
              the batch), so that p can move by 1 in ada_kimg thousand real images (NVIDIA: 500; 100 when a run starts
              from another run's networks, their transfer learning)
    diffaug   DiffAugment(images, policy) of Zhao et al. 2020, no probability

Reals and fakes are augmented in the D step and fakes in the G step, each call with its own draws
(training/step/loss.py). The sign statistic accumulates on the device (float64: sums of signs and their count, exact as
integers) and is summed over the processes at each adjustment; the adjustment runs on the device too, so nothing of it
reads the GPU back. p, the statistic and the count of D steps since the last adjustment are the loss's state
(`state_dict`): every snapshot keeps them and a resumed run continues p bit for bit.
"""

from __future__ import annotations

import torch

from training.step.augment import AUGPIPE_SPECS, DIFFAUGMENT_POLICIES, AugmentPipe, DiffAugment

#----------------------------------------------------------------------------

AUGMENTS = ('noaug', 'ada', 'fixed', 'diffaug')
AUGPIPES = tuple(AUGPIPE_SPECS)
ADA_TARGET = 0.6          # NVIDIA's default target of r_t.
ADA_INTERVAL = 4          # D steps between adjustments.
ADA_KIMG = 500.0          # Thousands of real images for p to move by 1.
ADA_KIMG_TRANSFER = 100.0 # ... when the run starts from another run's networks (NVIDIA's --resume).
STATE_KEYS = ('augment_p', 'ada_signs', 'ada_count', 'ada_steps')  # What state_dict holds: float scalars.


def check_policy(policy: str) -> None:
    """Refuse, in one line, a DiffAugment policy that is not a comma-separated list of DIFFAUGMENT_POLICIES."""
    unknown = [name for name in policy.split(',') if name not in DIFFAUGMENT_POLICIES]
    if unknown or not policy:
        raise ValueError(f'--diffaug takes a comma-separated list of {", ".join(DIFFAUGMENT_POLICIES)}; got "{policy}"')


class Augmentation:
    """The augmentation of D's inputs for one --aug (see the module docstring)."""

    def __init__(self,
        aug: str,                           # 'ada', 'fixed' or 'diffaug'.
        augpipe: str = 'bgc',               # NVIDIA's pipeline (ada, fixed): a key of AUGPIPE_SPECS.
        diffaug: str = 'color,translation,cutout',  # DiffAugment's policy (diffaug).
        p: float = 0.0,                     # The probability (fixed), or ADA's starting value.
        target: float = ADA_TARGET,         # ADA's target of r_t.
        ada_kimg: float = ADA_KIMG,         # ADA's speed: thousands of real images per unit of p.
        interval: int = ADA_INTERVAL,       # D steps between adjustments.
        device: torch.device | str | None = None,
    ) -> None:
        if aug not in AUGMENTS[1:]:
            raise ValueError(f'unknown aug "{aug}"; valid: {", ".join(AUGMENTS[1:])}')
        self.aug, self.policy, self.target = aug, diffaug, float(target)
        self.interval, self.ada_kimg = interval, ada_kimg
        self.pipe = None
        if aug == 'diffaug':
            check_policy(diffaug)
        else:
            if augpipe not in AUGPIPE_SPECS:
                raise ValueError(f'unknown augpipe "{augpipe}"; valid: {", ".join(AUGPIPES)}')
            self.pipe = AugmentPipe(**AUGPIPE_SPECS[augpipe]).train().requires_grad_(False).to(device)
            self.pipe.p.fill_(p)
        zeros = lambda: torch.zeros([], dtype=torch.float64, device=device)
        self.signs, self.count = zeros(), zeros()  # Sum of the signs of D on reals since the adjustment, their number.
        self.steps = 0  # D steps since the last adjustment (a host number: deciding when to adjust reads nothing back).

    @property
    def adaptive(self) -> bool:
        return self.aug == 'ada'

    @property
    def p(self) -> torch.Tensor | None:
        """The pipe's probability (a device scalar; None for DiffAugment)."""
        return None if self.pipe is None else self.pipe.p

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """A(images): [N, C, H, W] in [-1, 1], each call with its own draws, differentiable w.r.t. the images."""
        return DiffAugment(images, self.policy) if self.pipe is None else self.pipe(images)

    def record(self, real_scores: torch.Tensor) -> None:
        """Add D's outputs on the reals of a D step (or an accumulation round) to ADA's statistic, on the device."""
        if self.adaptive:
            self.signs.add_(real_scores.detach().sign().sum(dtype=torch.float64))
            self.count.add_(real_scores.numel())

    def d_step_done(self) -> None:
        """After every D step: at every interval-th, ADA's adjustment of p."""
        if not self.adaptive:
            return
        self.steps += 1
        if self.steps == self.interval:
            self.adjust()

    def adjust(self) -> None:
        """p <- max(p + sign(r_t - target) * n / (ada_kimg * 1000), 0), r_t and n (the reals counted) summed over the
        processes, in float64 as NVIDIA's statistic, added to p in p's float32; the statistic starts again."""
        totals = torch.stack([self.signs, self.count])
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(totals)
        signs, count = totals.unbind()
        r_t = signs / count.clamp(min=1)  # No reals counted (never in a run): no change.
        p = self.pipe.p
        p.copy_((p + ((r_t - self.target).sign() * count / (self.ada_kimg * 1000)).to(p.dtype)).clamp(min=0))
        self.signs.zero_()
        self.count.zero_()
        self.steps = 0

    def state_tensors(self) -> list[torch.Tensor]:
        """The device tensors a step changes (the statistic; p between steps)."""
        return [self.signs, self.count] + ([] if self.pipe is None else [self.pipe.p])

    def state_dict(self) -> dict[str, torch.Tensor]:
        """p, the statistic and the D steps since the last adjustment, on the CPU (a snapshot's loss_states)."""
        p = torch.zeros([]) if self.pipe is None else self.pipe.p.detach().cpu().clone()
        return dict(augment_p=p, ada_signs=self.signs.cpu().clone(), ada_count=self.count.cpu().clone(),
                    ada_steps=torch.tensor(float(self.steps), dtype=torch.float64))

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Continue from a state_dict (in place)."""
        if self.pipe is not None:
            self.pipe.p.copy_(state['augment_p'])
        self.signs.copy_(state['ada_signs'])
        self.count.copy_(state['ada_count'])
        self.steps = int(state['ada_steps'])
