"""The D step and the G step of a run, as the training loop and the bench scripts call them.

    set_plan(plan)                                  # learning rates, Adam resets, level of detail
    discriminator(real_img, real_c, gen_c, ...)     # z ~ N(0, I) on the device; one D update
    generator(gen_c, ...)                           # z ~ N(0, I) on the device; one G update, then G_ema

Each step is one `NetworkUpdater.run` (training/step/updater.py) on the `GANLoss` (training/step/loss.py) per phase
of the loss (one, but for StyleGAN2's lazy regularization), with its latents drawn inside the step from the device's
generator. On CUDA each kind of step is replayed as a CUDA graph where that passes its check
(training/step/graphs.py; `cuda_graphs`): the caller never knows which. So that the eager and the replayed step compute the same, on CUDA the
optimizers are capturable either way (step counts and learning rates on the device); on a CPU nothing
of this applies and the step is the plain eager one.

The graph key of a step is what a replay cannot change: the shapes of its inputs, the accumulation
rounds, and for progressive growing the active resolution and whether a fade-in is under way (its
progress, the lod, is a device tensor that the networks read), and the step's phases (the loss's `phases`:
StyleGAN2's lazily scheduled path length term and R1 take an optimizer step of their own). The EMA
decay, which gn-stylegan2's ramp-up changes at every step, is a device tensor the G step reads. A run with --aug
runs eagerly (AUGMENT_NOT_CAPTURED), and after every D step ADA's p is adjusted when due (training/step/ada.py).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import torch

import dnnlib
from torch_utils import compat
from training.step.graphs import CapturedStep, CudaGraphs, CudaGraphsBroken
from training.step.updater import NetworkUpdater, make_capturable

#----------------------------------------------------------------------------

CUDA_GRAPHS = ('auto', 'on', 'off')
AUGMENT_NOT_CAPTURED = ('CUDA graphs off: steps with --aug (its draws, ADA\'s p) have not been verified under capture; '
                        'the steps run eagerly')
FP16_NOT_CAPTURED = ('--cuda-graphs=on cannot capture --precision=fp16: its dynamic loss scaling reads the overflow '
                     'flag on the host at every step; use --precision=bf16, or --cuda-graphs=auto (eager fp16 steps)')


def use_cuda_graphs(mode: str, device: torch.device, num_gpus: int, precision_name: str) -> tuple[bool, str | None]:
    """Whether steps are captured, and where --cuda-graphs=auto leaves a CUDA device without graphs, the one line why.

        'off', or a CPU:  never (nothing to say)
        'on':             captured, with one process or several (their first-replay verdicts agreed); refused with
                          fp16, whose dynamic loss scaling reads the scaler's overflow flag on the host at every step
                          (ValueError), and on a torch that lacks what repairs a capture failed inside CUDA
                          (compat.cuda_graph_repair_missing; CudaGraphsBroken, which train.py reports in one line)
        'auto':           captured where everything graphs rely on holds: not fp16, the repair there, a torch release on
                          which a GPU passed the graph tests (compat.CUDA_GRAPHS_VERIFIED), one process (several have
                          not run on several GPUs); else the reason, first of these that fails

    What each torch release needs besides (the generator's repair on 2.5 to 2.11, the capture stream's cuBLAS
    workspace kept on 2.12 and newer) CudaGraphs does on every release: docs/ops.md's table."""
    dnnlib.util.check_choice('cuda_graphs', mode, CUDA_GRAPHS)
    if mode == 'on' and precision_name == 'fp16':
        raise ValueError(FP16_NOT_CAPTURED)
    if device.type != 'cuda' or mode == 'off':
        return False, None
    missing = compat.cuda_graph_repair_missing()
    if mode == 'on':
        if missing is not None:
            raise CudaGraphsBroken(f'--cuda-graphs=on: torch {torch.__version__} lacks {missing}, which puts CUDA back '
                                   f'after a capture that fails inside it; use --cuda-graphs=auto or off')
        return True, None
    unverified = compat.cuda_graphs_unverified()
    why = ('--precision=fp16 reads its loss scaler\'s overflow flag on the host at every step' if precision_name == 'fp16'
           else f'torch {torch.__version__} lacks {missing}, which puts CUDA back after a failed capture' if missing
           else unverified if unverified
           else f'{num_gpus} processes (graphs have not run on several GPUs; --cuda-graphs=on captures them)'
           if num_gpus > 1 else None)
    if why is not None:
        return False, f'CUDA graphs off (--cuda-graphs=auto): {why}; the steps run eagerly'
    return True, None


class TrainingStep:
    """A run's D step and G step (see the module docstring)."""

    def __init__(self,
        G: torch.nn.Module,                     # Generator, called as G(z, c).
        D: torch.nn.Module,                     # Discriminator.
        G_opt: torch.optim.Optimizer,           # Their optimizers.
        D_opt: torch.optim.Optimizer,
        loss: Any,                              # GANLoss of G and D (training/step/loss.py).
        G_ema: torch.nn.Module | None = None,   # G's moving average, advanced after each G step (None: none).
        group_size: int = 1,                    # D's minibatch-stddev groups (kept whole by accumulation rounds).
        cuda_graphs: str = 'auto',              # 'auto', 'on' or 'off' (use_cuda_graphs).
        num_gpus: int = 1,                      # Processes of the run.
        log: Callable[[str], None] = print,     # Lines about graphs that stay eager.
        graph_engine: CudaGraphs | None = None, # What captures and replays (None: CUDA's where cuda_graphs says; tests:
                                                # an emulation on a CPU).
    ) -> None:
        self.G, self.D, self.G_ema, self.loss = G, D, G_ema, loss
        self.device = next(D.parameters()).device
        precision = loss.precision
        if graph_engine is None:
            use, why = use_cuda_graphs(cuda_graphs, self.device, num_gpus, precision.name)
            if use and getattr(loss, 'augment', None) is not None:
                use, why = False, AUGMENT_NOT_CAPTURED
            if why is not None:
                log(why)
            if use:
                graph_engine = CudaGraphs(self.device)
        if self.device.type == 'cuda' or graph_engine is not None:  # The same optimizer arithmetic, graphs or not.
            for optimizer in (G_opt, D_opt):
                make_capturable(optimizer)
        scaler = lambda: precision.grad_scaler(self.device.type)
        self.updaters = {'D': NetworkUpdater('D', D, D_opt, scaler(), group_size=group_size),
                         'G': NetworkUpdater('G', G, G_opt, scaler(), group_size=group_size, ema=G_ema)}
        self.captured = {net: CapturedStep(net, self._state, graph_engine, log) for net in ('D', 'G')}
        self.lod: float | None = None  # The level of detail of progressive growing (None: none).
        self.ema_beta = torch.zeros([], dtype=torch.float64, device=self.device)  # G_ema's decay, read by the G step.

    def release_graphs(self) -> None:
        """Free the graphs of both steps (they are captured again when next used)."""
        for captured in self.captured.values():
            captured.release()

    def set_plan(self, plan: Any) -> None:
        """The schedule's plan for this G step (training/recipes/schedule.py): learning rates, optimizer state
        resets and the level of detail."""
        self.updaters['G'].set_plan(plan.lr_G, plan.optimizer_state_id)
        self.updaters['D'].set_plan(plan.lr_D, plan.optimizer_state_id)
        self.lod = plan.lod
        if plan.lod is not None:
            for module in (self.G, self.D, self.G_ema):
                if module is not None:
                    module.set_lod(plan.lod)

    def discriminator(self, real_img: torch.Tensor, real_c: torch.Tensor, gen_c: torch.Tensor, rounds: int,
                      step: int) -> None:
        """One D update of G step `step` on this process's reals and the fakes of `gen_c`'s labels, in `rounds`
        accumulation rounds."""
        self.updaters['D'].set_step(step)
        phases = self.loss.phases('D', step)
        key = ('D', tuple(real_img.shape), tuple(real_c.shape), tuple(gen_c.shape), rounds, self._structure(), phases)
        self.captured['D'](key, functools.partial(self._discriminator_step, rounds=rounds, phases=phases),
                           dict(real_img=real_img, real_c=real_c, gen_c=gen_c))
        if getattr(self.loss, 'augment', None) is not None:
            self.loss.augment.d_step_done()  # ADA: p adjusted on the device after every 4th D step.

    def generator(self, gen_c: torch.Tensor, rounds: int, step: int, ema_beta: float = 0.0) -> None:
        """One G update of G step `step` on the fakes of `gen_c`'s labels, in `rounds` accumulation rounds; then
        G_ema <- ema_beta * G_ema + (1 - ema_beta) * G."""
        self.updaters['G'].set_step(step)
        self.ema_beta.fill_(ema_beta)
        phases = self.loss.phases('G', step)
        key = ('G', tuple(gen_c.shape), rounds, self._structure(), phases)
        self.captured['G'](key, functools.partial(self._generator_step, rounds=rounds, phases=phases), dict(gen_c=gen_c))

    def _discriminator_step(self, real_img: torch.Tensor, real_c: torch.Tensor, gen_c: torch.Tensor, rounds: int,
                            phases: tuple[str, ...]) -> None:
        for phase in phases:  # Each with its own latents, as NVIDIA's.
            gen_z = torch.randn(real_img.shape[0], self.G.z_dim, device=self.device)
            self.loss.set_phase('D', phase)
            self.updaters['D'].run(self.loss, [real_img, real_c, gen_z, gen_c], rounds)

    def _generator_step(self, gen_c: torch.Tensor, rounds: int, phases: tuple[str, ...]) -> None:
        for phase in phases:
            gen_z = torch.randn(gen_c.shape[0], self.G.z_dim, device=self.device)
            self.loss.set_phase('G', phase)
            self.updaters['G'].run(self.loss, [None, None, gen_z, gen_c], rounds)
        if self.G_ema is not None:
            self.updaters['G'].update_ema(self.ema_beta)

    def _structure(self) -> tuple[int, bool] | None:
        """What of the level of detail decides which layers run: the active resolution, and a fade-in or not."""
        if self.lod is None:
            return None
        return math.floor(self.lod), self.lod > math.floor(self.lod)

    def _state(self) -> list[torch.Tensor]:
        """Every tensor a step may change: the networks' parameters and buffers, the optimizers' state, the
        divergence flags."""
        tensors = []
        for module in (self.G, self.D, self.G_ema):
            if module is not None:
                tensors += list(module.parameters()) + list(module.buffers())
        for updater in self.updaters.values():
            tensors += [value for state in updater.optimizer.state.values() for value in state.values() if torch.is_tensor(value)]
            tensors.append(updater.first_bad_step)
        return tensors + self.loss.state_tensors()
