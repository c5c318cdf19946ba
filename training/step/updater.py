"""One network's optimizer steps: the training step that the loop and every bench script run.

A `NetworkUpdater` owns a network (D or G), its optimizer and its loss scaler. One `step()` is

    zero the gradients
    for each of `rounds` accumulation rounds:                 # the process's share, split (split_round)
        loss.accumulate_gradients(net, round's batch, gain)   # gain = loss scale / rounds
    average the gradients over processes
    remember the first step whose gradient was NaN/Inf       # on the device: read only at a tick
    optimizer step (through the scaler: unscaled, skipped on fp16 overflow)
    average the buffers over processes (BatchNorm statistics, w_avg)

with the network's parameters requiring grad only inside it (so D's step leaves no gradients in
G, and G's step none in D). `set_plan()` applies the schedule's learning rate and clears Adam's
moments whenever the schedule's optimizer state id changes (StyleGAN v1 at every new lod). The
generator's updater also keeps the moving average G_ema (`update_ema`).
"""

from __future__ import annotations

from typing import Any, Hashable

import numpy as np
import torch

from torch_utils import misc

#----------------------------------------------------------------------------

NEVER = np.iinfo(np.int64).max  # "No step yet" in first_bad_step.


def split_round(x: torch.Tensor, round_idx: int, rounds: int, group_size: int = 1) -> torch.Tensor:
    """Samples of accumulation round `round_idx` out of a process's batch x, keeping D's sample groups whole.

    StyleGAN's minibatch stddev groups samples i, i + N/G, i + 2N/G, ... of a batch of N (G = group
    size). Viewing x as [G, N/G, ...], round r takes columns [r * n/G, (r+1) * n/G) (n = N / rounds):
    whole groups, laid out so that the round's own stddev layer forms exactly those groups. With
    group_size 1 this is the r-th contiguous slice.
    """
    if rounds == 1:
        return x
    n = x.shape[0] // rounds
    g = min(group_size, n)
    cols = n // g
    return x.reshape(g, x.shape[0] // g, *x.shape[1:])[:, round_idx * cols:(round_idx + 1) * cols].reshape(n, *x.shape[1:])


def grad_norm(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """Total L2 norm of the parameters' gradients, on the device (no host sync)."""
    grads = [p.grad for p in params if p.grad is not None]
    return torch.stack(torch._foreach_norm(grads)).norm() if grads else torch.zeros([])


@torch.no_grad()
def update_ema(G_ema: torch.nn.Module, G: torch.nn.Module, beta: float) -> None:
    """G_ema <- beta * G_ema + (1 - beta) * G for parameters; buffers (BN statistics, w_avg, lod) are copied."""
    # One fused kernel per list (torch's own swa_utils and optimizers use these foreach ops).
    torch._foreach_lerp_(list(G_ema.parameters()), list(G.parameters()), 1 - beta)
    buffers = list(G_ema.buffers())
    if buffers:  # The foreach ops refuse empty lists.
        torch._foreach_copy_(buffers, list(G.buffers()))


class NetworkUpdater:
    """Optimizer steps of one network (see the module docstring)."""

    def __init__(self,
        net: str,                               # 'D' or 'G': which step of the loss this updater runs.
        module: torch.nn.Module,                # The network being trained.
        optimizer: torch.optim.Optimizer,       # Its optimizer (Adam in every preset).
        scaler: torch.amp.GradScaler,           # Loss scaling (enabled for fp16 only; training/step/precision.py).
        group_size: int = 1,                    # D's sample groups that accumulation rounds keep whole.
        ema: torch.nn.Module | None = None,     # G: the moving-average copy that update_ema() advances.
    ) -> None:
        self.net, self.module, self.optimizer, self.scaler = net, module, optimizer, scaler
        self.group_size, self.ema = group_size, ema
        # The parameters once: each module.parameters() walks the module tree in Python (hundreds of calls per step).
        self.params = list(module.parameters())
        device = self.params[0].device
        self.first_bad_step = torch.full([], NEVER, dtype=torch.int64, device=device)  # Counted from 1; NEVER: none yet.
        self._optimizer_state_id: Hashable | None = None  # None: keep whatever state the optimizer holds.

    def set_plan(self, lr: float, optimizer_state_id: Hashable) -> None:
        """This step's learning rate; Adam's state cleared when the schedule's optimizer state id changes."""
        if self._optimizer_state_id is not None and optimizer_state_id != self._optimizer_state_id:
            self.optimizer.state.clear()
        self._optimizer_state_id = optimizer_state_id
        for group in self.optimizer.param_groups:
            group['lr'] = lr

    def accumulate(self, loss: Any, batch: list[torch.Tensor | None], rounds: int) -> None:
        """Gradients of this process's batch [real_img, real_c, gen_z, gen_c] (reals None for G) in `rounds`
        accumulation rounds, averaged over processes; left in the parameters' .grad, scaled for fp16."""
        for p in self.params:  # module.requires_grad_(True) and optimizer.zero_grad(set_to_none=True), less Python.
            p.requires_grad_(True)
            p.grad = None
        ones = torch.ones([], device=self.first_bad_step.device)
        gain = self.scaler.scale(ones) / rounds if self.scaler.is_enabled() else 1 / rounds
        for r in range(rounds):
            round_batch = batch if rounds == 1 else [x if x is None else split_round(x, r, rounds, self.group_size)
                                                     for x in batch]
            loss.accumulate_gradients(self.net, *round_batch, gain=gain)
        for p in self.params:
            p.requires_grad_(False)
        misc.all_reduce_mean_grads([p for p in self.params if p.grad is not None])

    def apply(self, step: int) -> None:
        """The optimizer step on the accumulated gradients of G step `step` (counted from 0)."""
        if not self.scaler.is_enabled():  # With fp16 an overflow only skips the step (GradScaler); the losses tell divergence.
            bad = ~torch.isfinite(grad_norm(self.params)) & (self.first_bad_step == NEVER)
            self.first_bad_step = torch.where(bad, step + 1, self.first_bad_step)  # Counted from 1, as in the progress lines.
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if misc.world_size() > 1:  # Else nothing to average (and no walk over the module's buffers).
            misc.all_reduce_mean_buffers(self.module)

    def step(self, loss: Any, batch: list[torch.Tensor | None], rounds: int, step: int) -> None:
        """One training step: `accumulate` then `apply`."""
        self.accumulate(loss, batch, rounds)
        self.apply(step)

    def update_ema(self, beta: float) -> None:
        """ema <- beta * ema + (1 - beta) * module (the generator's updater)."""
        update_ema(self.ema, self.module, beta)
