"""The run's schedule: what every training step uses, and when the run is done.

One interface, two implementations:

    FixedSchedule        the SN-GAN/BigGAN presets: constant batches, n_dis D steps per G step,
                         optional linear learning-rate decay to 0, length in G steps;
    ProgressiveSchedule  GN-StyleGAN: StyleGAN v1's progressive growing (training/recipes/progressive.py),
                         batch and learning rate by active resolution, length in real images.

The training loop asks `plan(step, cur_nimg)` before every G step and gets a `StepPlan`: global
batches, each process's share and how it splits into accumulation rounds, learning rates, EMA
decay, level of detail, and the optimizer state id (Adam state is reset whenever it changes, as
StyleGAN v1 does at every new lod). `done(step, cur_nimg)` ends the run; `progress()` feeds the
ETA; `phase_label()` names the phase of progressive growing (stable or fade-in, resolution).

Batches are global: fixed by the preset whatever the number of processes. A process takes
batch / num_gpus samples, in `rounds` accumulation rounds of batch_gpu samples each, where
batch_gpu is the largest divisor of the share not above `batch_gpu` (the --batch-gpu cap) that
keeps D's sample groups whole (`group_size`: StyleGAN's minibatch-stddev groups of 4). Every loss
the project trains with is a mean of per-sample terms, so averaging the rounds' gradients gives the
gradient of the whole batch (up to float rounding; BatchNorm statistics are per round, exactly as
they are per process with several GPUs).
"""

from __future__ import annotations

import dataclasses
import math

from training.recipes import progressive

#----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StepPlan:
    batch_D: int            # Global batch of a D step (reals; as many fakes), all processes together.
    batch_G: int            # Global batch of the G step.
    share_D: int            # This process's samples of a D step: batch_D / num_gpus.
    share_G: int            # Same for the G step.
    rounds_D: int           # Accumulation rounds the share of a D step is split into (share_D / rounds_D at once).
    rounds_G: int           # Same for the G step.
    n_dis: int              # D steps per G step.
    lr_G: float             # Adam learning rates of this step.
    lr_D: float
    ema_beta: float         # G_ema <- beta * G_ema + (1 - beta) * G after the G step.
    lod: float | None       # Level of detail of progressive growing (None: fixed-resolution networks).
    optimizer_state_id: tuple  # The Adam state is reset whenever this changes.

    @property
    def batch_gpu_D(self) -> int:
        """Samples one process handles at once in a D step (one accumulation round)."""
        return self.share_D // self.rounds_D

    @property
    def batch_gpu_G(self) -> int:
        return self.share_G // self.rounds_G


def split_batch(batch: int, num_gpus: int, batch_gpu: int | None, group_size: int = 1, what: str = 'batch') -> int:
    """Samples per process and round for a global `batch`: the largest divisor of batch / num_gpus
    that is at most `batch_gpu` (None: no cap) and a multiple of `group_size` (or the whole share)."""
    if batch % num_gpus != 0:
        raise ValueError(f'the global {what} {batch} is not divisible by --gpus={num_gpus}')
    share = batch // num_gpus
    cap = share if batch_gpu is None else min(batch_gpu, share)
    for n in range(cap, 0, -1):
        if share % n == 0 and (n % group_size == 0 or n == share):
            return n
    raise ValueError(f'--batch-gpu={batch_gpu}: no accumulation round of at most {batch_gpu} samples splits the '
                     f'{what} share of {share} per GPU into whole groups of {group_size} (minibatch stddev)')


def _shrunk_groups_note(num_gpus: int, where: str) -> str:
    """The line that says D's minibatch-stddev groups are smaller on `num_gpus` GPUs than on one (`where`: by how
    much). A D call groups min(group size, its samples) samples (training/networks/stylegan.py), so a per-GPU share
    below the group size changes what D computes. Said, not refused: StyleGAN v1 shrinks its groups the same way,
    and no --batch-gpu can restore them."""
    return (f'Note: --gpus={num_gpus} shrinks D\'s minibatch-stddev groups, as a GPU\'s share of the batch is smaller '
            f'than a group: {where}')


def kimg_text(nimg: int) -> str:
    """Images in thousands, to the image as snapshot names give them: '64,000', '0.992' (not '1.0')."""
    return f'{nimg / 1000:,.3f}'.rstrip('0').rstrip('.')

#----------------------------------------------------------------------------


class FixedSchedule:
    """Constant batches for `total_steps` G steps, optional linear lr decay and an EMA from `ema_start`."""

    def __init__(self,
        batch_D: int,                       # Global D batch M.
        batch_G: int,                       # Global G batch (2M in SN-GAN).
        n_dis: int,                         # D steps per G step.
        lr_G: float,                        # Initial Adam learning rates.
        lr_D: float,
        total_steps: int,                   # Run length in G steps.
        lr_decay: str = 'none',             # 'linear' (to 0 at total_steps) or 'none'.
        ema_beta: float | None = None,      # G EMA decay per G step (None: G_ema is a copy of G).
        ema_start: int = 0,                 # G step from which the EMA averages (before: a copy of G).
        num_gpus: int = 1,                  # Processes sharing each batch.
        batch_gpu: int | None = None,       # Cap on the samples one process handles at once (None: its whole share).
        group_size: int = 1,                # D's sample groups that must stay within one round.
        ema_kimg: float | None = None,      # Instead of ema_beta: G EMA half-life in thousands of images (StyleGAN2).
        ema_rampup: float | None = None,    # With ema_kimg: the half-life is at most this times the images shown.
        reg_interval_G: int = 1,            # NVIDIA's lazy regularization: G's regularizer every this many G steps...
        reg_interval_D: int = 1,            # ...and D's every this many D steps (describe() says what that does to lr).
    ) -> None:
        if lr_decay not in ('linear', 'none'):
            raise ValueError(f'lr_decay must be "linear" or "none", got "{lr_decay}"')
        if total_steps < 1 or n_dis < 1:
            raise ValueError('the run needs total_steps >= 1 and n_dis >= 1')
        self.batch_D, self.batch_G, self.n_dis = batch_D, batch_G, n_dis
        self.lr_G, self.lr_D, self.lr_decay = lr_G, lr_D, lr_decay
        self.total_steps, self.ema_beta, self.ema_start = total_steps, ema_beta, ema_start
        self.num_gpus, self.group_size = num_gpus, group_size
        self.ema_kimg, self.ema_rampup = ema_kimg, ema_rampup
        self.reg_intervals = dict(G=reg_interval_G, D=reg_interval_D)
        self.batch_gpu_D = split_batch(batch_D, num_gpus, batch_gpu, group_size, 'D batch')
        self.batch_gpu_G = split_batch(batch_G, num_gpus, batch_gpu, group_size, 'G batch')

    def plan(self, step: int, cur_nimg: int) -> StepPlan:
        scale = 1 - step / self.total_steps if self.lr_decay == 'linear' else 1.0
        ema = self.ema_beta if self.ema_beta is not None and step >= self.ema_start else 0.0
        if self.ema_kimg is not None:  # StyleGAN2-ADA: beta = 0.5 ** (batch / half-life in images), ramped up.
            ema_nimg = self.ema_kimg * 1000 if self.ema_rampup is None else min(self.ema_kimg * 1000, cur_nimg * self.ema_rampup)
            ema = 0.5 ** (self.batch_G / max(ema_nimg, 1e-8))
        share_D, share_G = self.batch_D // self.num_gpus, self.batch_G // self.num_gpus
        return StepPlan(batch_D=self.batch_D, batch_G=self.batch_G, share_D=share_D, share_G=share_G,
                        rounds_D=share_D // self.batch_gpu_D, rounds_G=share_G // self.batch_gpu_G, n_dis=self.n_dis,
                        lr_G=self.lr_G * scale, lr_D=self.lr_D * scale, ema_beta=ema, lod=None, optimizer_state_id=())

    def done(self, step: int, cur_nimg: int) -> bool:
        return step >= self.total_steps

    def length(self) -> str:
        """The run's length as the command line gives it: '300 G steps'."""
        return f'{self.total_steps:,} G steps'

    def lr_course(self) -> str | None:
        """Where the learning rates go over the run, if they change (None: constant)."""
        return f'falling linearly to 0 at G step {self.total_steps:,}' if self.lr_decay == 'linear' else None

    def progress(self, step: int, cur_nimg: int) -> float:
        """Share of the run done, in [0, 1]."""
        return min(step / self.total_steps, 1.0)

    def phase_label(self, step: int, cur_nimg: int) -> str | None:
        return None

    def min_share(self) -> int:
        """Smallest number of reals one process takes for a D step during the run."""
        return self.batch_D // self.num_gpus

    def group_size_note(self) -> str | None:
        """One line when the GPUs' shares make D's minibatch-stddev groups smaller than on one GPU (else None)."""
        if self.num_gpus == 1 or self.group_size == 1:
            return None
        n, one = min(self.group_size, self.batch_gpu_D), min(self.group_size, self.batch_D)
        return None if n >= one else _shrunk_groups_note(self.num_gpus, f'{n} instead of {one} samples')

    def describe(self) -> list[str]:
        """The schedule as lines of text, for `train.py --dry-run`."""
        plan = self.plan(0, 0)
        rounds_D, rounds_G = plan.rounds_D, plan.rounds_G
        decay = 'linear decay to 0' if self.lr_decay == 'linear' else 'constant'
        ema = 'none' if self.ema_beta is None else f'{self.ema_beta} per G step from step {self.ema_start}'
        if self.ema_kimg is not None:
            ema = f'half-life {self.ema_kimg:g} kimg' + ('' if self.ema_rampup is None else
                                                        f', at most {self.ema_rampup:g} x the images shown (ramp-up)')
        lines = [
            f'{self.total_steps:,} G steps, each after {self.n_dis} D step(s): '
            f'{kimg_text(self.total_steps * self.n_dis * self.batch_D)} kimg of reals',
            f'D step: global batch {self.batch_D} = {self.num_gpus} GPU(s) x {rounds_D} round(s) x {self.batch_gpu_D}',
            f'G step: global batch {self.batch_G} = {self.num_gpus} GPU(s) x {rounds_G} round(s) x {self.batch_gpu_G}',
            f'learning rate G {self.lr_G:g}, D {self.lr_D:g}, {decay}; G EMA {ema}',
        ]
        # NVIDIA's lazy regularization: a regularizer every k steps, in a step of its own, and the network's Adam lr and
        # betas scaled so that its k + 1 steps move it as k plain ones did: lr * k / (k + 1), betas ** (k / (k + 1)).
        lazy = [(net, k, lr) for net, lr in (('G', self.lr_G), ('D', self.lr_D)) if (k := self.reg_intervals[net]) > 1]
        if lazy:
            lines.append('lazy regularization (NVIDIA\'s): ' + '; '.join(
                f'{net}\'s regularizer every {k} {net} steps, in a step of its own, so {net}\'s lr is '
                f'--{net.lower()}lr={lr * (k + 1) / k:g} x {k}/{k + 1} = {lr:g} and its Adam betas ** ({k}/{k + 1})'
                for net, k, lr in lazy))
        return lines

#----------------------------------------------------------------------------


class ProgressiveSchedule:
    """StyleGAN v1's progressive growing from `start_resolution` to `max_resolution` over `total_kimg`.

    At cur_nimg real images: lod = progressive.lod_at(...), active resolution R = max_resolution /
    2**floor(lod); global minibatch batch[R] (capped at `max_batch`) for D and G alike; Adam learning
    rates lr_G[R] and lr_D[R], times min(1, kimg_left / lr_rampdown_kimg) when a ramp-down is asked for
    (linear to 0 at the end of the run; v1's rate is constant); G EMA decay beta = 0.5 ** (minibatch
    / (ema_kimg * 1000)), a half-life of ema_kimg thousand images. The optimizer state id is
    (floor(lod), ceil(lod)): it changes when a fade-in starts and when it ends, where v1 resets Adam
    (`reset_opt_for_new_lod`).
    """

    def __init__(self,
        max_resolution: int,                            # Final resolution (the networks' img_resolution).
        total_kimg: float = progressive.TOTAL_KIMG,     # Run length in thousands of real images.
        start_resolution: int = progressive.START_RESOLUTION,
        phase_kimg: float = progressive.PHASE_KIMG,     # Thousands of images per stable phase...
        fade_kimg: float = progressive.FADE_KIMG,       # ...and per fade-in.
        batch: dict | None = None,                      # Global minibatch by resolution (default progressive.BATCH).
        lr_G: dict | None = None,                       # G's learning rate by resolution (default progressive.LR).
        lr_D: dict | None = None,                       # D's (default progressive.LR).
        max_batch: int | None = None,                   # Cap on the global minibatch (--batch).
        ema_kimg: float = progressive.EMA_KIMG,         # Half-life of the G EMA in thousands of images.
        lr_rampdown_kimg: float = 0,                    # Lrs fall linearly to 0 over the run's last kimg (0: constant).
        num_gpus: int = 1,
        batch_gpu: int | None = None,
        group_size: int = 1,
    ) -> None:
        # Keys may arrive as strings from a config that went through JSON.
        self.batch = {int(r): int(n) for r, n in (progressive.BATCH if batch is None else batch).items()}
        self.lr_G, self.lr_D = ({int(r): float(v) for r, v in (progressive.LR if lr is None else lr).items()}
                                for lr in (lr_G, lr_D))
        if max_batch is not None:
            self.batch = {r: min(n, max_batch) for r, n in self.batch.items()}
        self.max_resolution, self.start_resolution = max_resolution, start_resolution
        self.phase_kimg, self.fade_kimg, self.total_kimg = phase_kimg, fade_kimg, total_kimg
        self.ema_kimg, self.num_gpus, self.group_size = ema_kimg, num_gpus, group_size
        if lr_rampdown_kimg < 0:
            raise ValueError(f'the learning-rate ramp-down must be at least 0 kimg, got {lr_rampdown_kimg}')
        self.lr_rampdown_kimg = lr_rampdown_kimg
        self.levels = []  # Active resolutions of the run, lowest first.
        res = start_resolution
        while res <= max_resolution:
            self.levels.append(res)
            res *= 2
        progressive.lod_at(0, max_resolution, start_resolution, phase_kimg, fade_kimg)  # Validates the arguments.
        missing = [r for r in self.levels if r not in self.batch or r not in self.lr_G or r not in self.lr_D]
        if missing:
            raise ValueError(f'the schedule has no minibatch size or learning rate for resolution {missing[0]}')
        self.batch_gpu = {r: split_batch(self.batch[r], num_gpus, batch_gpu, group_size, f'minibatch at {r}x{r}')
                          for r in self.levels}

    def _lod(self, cur_nimg: int) -> float:
        return progressive.lod_at(cur_nimg, self.max_resolution, self.start_resolution, self.phase_kimg, self.fade_kimg)

    def plan(self, step: int, cur_nimg: int) -> StepPlan:
        lod = self._lod(cur_nimg)
        res = progressive.lod_to_resolution(lod, self.max_resolution)
        batch = self.batch[res]
        share = batch // self.num_gpus
        rounds = share // self.batch_gpu[res]
        scale = self._lr_scale(cur_nimg)
        return StepPlan(batch_D=batch, batch_G=batch, share_D=share, share_G=share, rounds_D=rounds, rounds_G=rounds,
                        n_dis=1, lr_G=self.lr_G[res] * scale, lr_D=self.lr_D[res] * scale, ema_beta=0.5 ** (batch / (self.ema_kimg * 1000)),
                        lod=lod, optimizer_state_id=(math.floor(lod), math.ceil(lod)))

    def _lr_scale(self, cur_nimg: int) -> float:
        # scale = clip((total_kimg - kimg) / lr_rampdown_kimg, 0, 1): 1 until the ramp-down, then linear to 0.
        if self.lr_rampdown_kimg == 0:
            return 1.0
        return min(max((self.total_kimg * 1000 - cur_nimg) / (self.lr_rampdown_kimg * 1000), 0.0), 1.0)

    def done(self, step: int, cur_nimg: int) -> bool:
        return cur_nimg >= self.total_kimg * 1000

    def length(self) -> str:
        return f'{self.total_kimg:,g} kimg'

    def lr_course(self) -> str | None:
        """Where the learning rates go over the run beyond their levels by resolution (None: nowhere)."""
        if self.lr_rampdown_kimg == 0:
            return None
        return f'falling linearly to 0 from kimg {max(self.total_kimg - self.lr_rampdown_kimg, 0):,g} to {self.total_kimg:,g}'

    def progress(self, step: int, cur_nimg: int) -> float:
        return min(cur_nimg / (self.total_kimg * 1000), 1.0)

    def _phases(self) -> list[tuple[str, int, float, float]]:
        """(kind, resolution, start kimg, end kimg) of every phase of the run, in order."""
        phases, kimg = [], 0.0
        for i, res in enumerate(self.levels):
            if i > 0 and self.fade_kimg > 0:
                phases.append(('fade-in', res, kimg, kimg + self.fade_kimg))
                kimg += self.fade_kimg
            end = kimg + self.phase_kimg if i < len(self.levels) - 1 else max(self.total_kimg, kimg)
            phases.append(('stable', res, kimg, end))
            kimg = end
        return [p for p in phases if p[2] < self.total_kimg or p is phases[0]]

    def phase_label(self, step: int, cur_nimg: int) -> str | None:
        """'fade-in 32x32 40%' or 'stable 64x64 12%': the current phase and how far it has got."""
        kimg = cur_nimg / 1000
        for kind, res, start, end in self._phases():
            if kimg < end or end >= self.total_kimg:
                done = (kimg - start) / max(min(end, self.total_kimg) - start, 1e-12)
                return f'{kind} {res}x{res} {100 * min(max(done, 0), 1):.0f}%'
        return None

    def min_share(self) -> int:
        return min(self.batch[r] for r in self.levels) // self.num_gpus

    def group_size_note(self) -> str | None:
        """As FixedSchedule.group_size_note, naming the resolutions whose groups shrink."""
        if self.num_gpus == 1 or self.group_size == 1:
            return None
        spans = []  # [samples per group, on one GPU, first resolution, last resolution]
        for r in self.levels:
            n, one = min(self.group_size, self.batch_gpu[r]), min(self.group_size, self.batch[r])
            if n < one and spans and spans[-1][:2] == [n, one] and spans[-1][3] * 2 == r:
                spans[-1][3] = r
            elif n < one:
                spans.append([n, one, r, r])
        if not spans:
            return None
        return _shrunk_groups_note(self.num_gpus, ', '.join(f'{n} instead of {one} samples at {lo}x{lo}' +
                                                            (f'-{hi}x{hi}' if hi > lo else '') for n, one, lo, hi in spans))

    def describe(self) -> list[str]:
        lines = [f'Progressive growing {self.start_resolution}x{self.start_resolution} -> '
                 f'{self.max_resolution}x{self.max_resolution}, {self.total_kimg:,g} kimg of reals, '
                 f'{self.num_gpus} GPU(s); Adam state reset at the start and end of every fade-in',
                 f'{"phase":<20s} {"kimg":>19s} {"global batch":>12s} {"per GPU":>8s} {"rounds":>6s} {"lr G":>8s} {"lr D":>8s}']
        for kind, res, start, end in self._phases():
            per_gpu = self.batch[res] // self.num_gpus
            lines.append(f'{f"{kind} {res}x{res}":<20s} {f"{start:,g} - {min(end, self.total_kimg):,g}":>19s} '
                         f'{self.batch[res]:>12d} {self.batch_gpu[res]:>8d} {per_gpu // self.batch_gpu[res]:>6d} '
                         f'{self.lr_G[res]:>8g} {self.lr_D[res]:>8g}')
        if self.lr_rampdown_kimg > 0:
            start = max(self.total_kimg - self.lr_rampdown_kimg, 0)
            lines.append(f'learning rates fall linearly to 0 from kimg {start:,g} to {self.total_kimg:,g}')
        return lines
