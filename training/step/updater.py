"""One network's optimizer steps: the training step that the loop and every bench script run.

A `NetworkUpdater` owns a network (D or G), its optimizer and its loss scaler. One `run()` is

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

A step can be captured as a CUDA graph and replayed (training/step/graphs.py): `run()` reads the G
step's number from a device tensor that `set_step()` fills, and writes what outlives the step in
place (the divergence flag, the optimizer's state, the moving average). `make_capturable()` turns
an Adam into one whose step counts and learning rate are device tensors; its state is then zeroed
in place on a reset, since a captured step holds references to it.
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


def make_capturable(optimizer: torch.optim.Optimizer) -> None:
    """Adam (or another torch optimizer with a `capturable` option) with its step counts and learning rates on the
    parameters' device, so that a CUDA graph can capture its step and a new learning rate needs no new capture."""
    for group in optimizer.param_groups:
        device = group['params'][0].device
        group['capturable'] = True
        if not (torch.is_tensor(group['lr']) and group['lr'].device == device):  # Captured steps may read it already.
            group['lr'] = torch.tensor(float(group['lr']), device=device)
        for p in group['params']:
            state = optimizer.state.get(p, {})
            if torch.is_tensor(state.get('step')):
                state['step'] = state['step'].to(device=device, dtype=torch.float32)


def portable_state_dict(optimizer: torch.optim.Optimizer) -> dict:
    """optimizer.state_dict() as a non-capturable optimizer gives it (float learning rates, step counts on the CPU),
    so that a snapshot resumes on any device, with or without CUDA graphs."""
    state_dict = optimizer.state_dict()  # Its groups are copies; its per-parameter states are the optimizer's own.
    for group in state_dict['param_groups']:
        if torch.is_tensor(group['lr']):
            group['lr'] = float(group['lr'])
        group['capturable'] = False
    state_dict['state'] = {key: {name: value.cpu() if name == 'step' and torch.is_tensor(value) else value
                                 for name, value in state.items()}
                           for key, state in state_dict['state'].items()}
    return state_dict


def reset_state(optimizer: torch.optim.Optimizer) -> None:
    """Forget the optimizer's moments and step counts (StyleGAN v1's reset at every new lod). A capturable
    optimizer's state tensors are zeroed in place, since captured steps hold references to them (zero is also
    what Adam starts from); any other's are dropped, to be made anew at the next step."""
    if not any(group.get('capturable', False) for group in optimizer.param_groups):
        optimizer.state.clear()
        return
    with torch.no_grad():
        for state in optimizer.state.values():
            for value in state.values():
                if torch.is_tensor(value):
                    value.zero_()


@torch.no_grad()
def update_ema(G_ema: torch.nn.Module, G: torch.nn.Module, beta: float | torch.Tensor) -> None:
    """G_ema <- beta * G_ema + (1 - beta) * G for parameters; buffers (BN statistics, w_avg, lod) are copied. beta may
    be a float64 device tensor (read by a captured step, so that a new decay needs no new capture): 1 - beta is then
    rounded once to float32, as torch rounds a Python number's."""
    # One fused kernel per list (torch's own swa_utils and optimizers use these foreach ops).
    params = list(G_ema.parameters())
    weight = 1 - beta if not torch.is_tensor(beta) else [(1 - beta).to(params[0].dtype)] * len(params)
    torch._foreach_lerp_(params, list(G.parameters()), weight)
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
        self.step_number = torch.zeros([], dtype=torch.int64, device=device)  # This step's, counted from 1 (set_step).
        self._optimizer_state_id: Hashable | None = None  # None: keep whatever state the optimizer holds.

    def set_plan(self, lr: float, optimizer_state_id: Hashable) -> None:
        """This step's learning rate; Adam's state cleared when the schedule's optimizer state id changes."""
        if self._optimizer_state_id is not None and optimizer_state_id != self._optimizer_state_id:
            reset_state(self.optimizer)
        self._optimizer_state_id = optimizer_state_id
        for group in self.optimizer.param_groups:
            if torch.is_tensor(group['lr']):  # Capturable: a device tensor that captured steps read.
                group['lr'].fill_(lr)
            else:
                group['lr'] = lr

    def set_step(self, step: int) -> None:
        """The number of the G step that the next `run()` belongs to (counted from 0), for the divergence flag."""
        self.step_number.fill_(step + 1)  # Counted from 1, as in the progress lines.

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

    def apply(self) -> None:
        """The optimizer step on the accumulated gradients of the G step given to `set_step`."""
        if not self.scaler.is_enabled():  # With fp16 an overflow only skips the step (GradScaler); the losses tell divergence.
            bad = ~torch.isfinite(grad_norm(self.params)) & (self.first_bad_step == NEVER)
            self.first_bad_step.copy_(torch.where(bad, self.step_number, self.first_bad_step))
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if misc.world_size() > 1:  # Else nothing to average (and no walk over the module's buffers).
            misc.all_reduce_mean_buffers(self.module)

    def run(self, loss: Any, batch: list[torch.Tensor | None], rounds: int) -> None:
        """One training step, of the G step given to `set_step`: `accumulate` then `apply`."""
        self.accumulate(loss, batch, rounds)
        self.apply()

    def update_ema(self, beta: float | torch.Tensor) -> None:
        """ema <- beta * ema + (1 - beta) * module (the generator's updater)."""
        update_ema(self.ema, self.module, beta)
