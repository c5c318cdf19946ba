"""The arithmetic of a run (`--precision`): one object for the matmul switch, autocast and loss scaling.

    name    matmuls / convolutions on CUDA      forward passes of G and D     loss scaling
    fp32    strict float32 (the paper's)        float32                       no
    tf32    TF32 tensor cores allowed           float32                       no
    bf16    TF32 allowed outside autocast       torch.autocast(bfloat16)      no
    fp16    TF32 allowed outside autocast       torch.autocast(float16)       yes (torch.amp.GradScaler)

'fp32' and 'tf32' are the same on a CPU. Under 'bf16' and 'fp16' only the networks' forward passes
run in the low-precision dtype; their outputs come back in float32, so GN's norm and division, the
penalties and the losses are float32 (training/step/loss.py). fp16 gradients need loss scaling: the
updater (training/step/updater.py) multiplies the loss by the scaler's scale and unscales before the
optimizer step.

The TF32 switch is process-wide (torch.backends flags): the training loop sets it for the run from
`allow_tf32` and restores it afterwards (torch_utils/devices.run_switches).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

import dnnlib

#----------------------------------------------------------------------------

AUTOCAST_DTYPES = {'fp32': None, 'tf32': None, 'bf16': torch.bfloat16, 'fp16': torch.float16}
PRECISIONS = tuple(AUTOCAST_DTYPES)


class Precision:
    """One of PRECISIONS, with what it implies for matmuls, forward passes and loss scaling."""

    def __init__(self, name: str = 'fp32') -> None:
        dnnlib.util.check_choice('precision', name, PRECISIONS)
        self.name = name
        self.autocast_dtype = AUTOCAST_DTYPES[name]  # None: forward passes in float32.
        self.allow_tf32 = name != 'fp32'  # May float32 matmuls and convolutions on CUDA use TF32 tensor cores?

    def __repr__(self) -> str:
        return f'Precision({self.name!r})'

    @contextlib.contextmanager
    def autocast(self, device_type: str) -> Iterator[None]:
        """Forward passes in the low-precision dtype (bf16, fp16); a no-op for fp32 and tf32."""
        if self.autocast_dtype is None:
            yield
            return
        with torch.autocast(device_type, dtype=self.autocast_dtype):
            yield

    def run(self, net: torch.nn.Module, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """net(x, c) under this precision's autocast; the output comes back in float32."""
        if self.autocast_dtype is None:
            return net(x, c)
        with self.autocast(x.device.type):
            out = net(x, c)
        return out.to(torch.float32)

    def lay_out(self, *networks: torch.nn.Module) -> None:
        """Put the networks' weights in the memory format their arithmetic is fastest in: channels-last on a CPU
        (oneDNN's convolutions) and under bf16/fp16 (what tensor cores prefer); as built for float32 on a GPU. The
        layout of the weights changes, not their values (nor the Parameter objects, which optimizers hold)."""
        for net in networks:
            param = next(net.parameters(), None)
            if param is not None and (param.device.type == 'cpu' or self.autocast_dtype is not None):
                net.to(memory_format=torch.channels_last)

    def grad_scaler(self, device_type: str) -> torch.amp.GradScaler:
        """A loss scaler, enabled for fp16 only (a disabled scaler passes gradients and steps through unchanged)."""
        return torch.amp.GradScaler(device_type, enabled=self.name == 'fp16')
