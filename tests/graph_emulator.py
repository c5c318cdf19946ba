"""CUDA graphs emulated on a CPU, for the tests of training/step/graphs.py and training/step/training_step.py.

A CUDA graph runs the Python of a step once, at capture, recording its kernels with the memory they read and
write; a replay runs those kernels again on that memory, and nothing else. So a replayed step goes wrong where
the eager step relies on Python at every call: a learning rate or step number baked in as a host number, a
tensor replaced (x = f(x)) where it should be written in place, an input read from anywhere but the static
buffer, a random draw made outside the step, a host read of a tensor (which capture refuses). `EmulatedGraphs`
gives the same semantics on a CPU: capture records every ATen operator of the step (a TorchDispatchMode sees
the autograd engine's backward operators too) with the tensors it used and made, then undoes what the
recording did to tensors that existed before (and to the random generator); a replay runs the recorded
operators again, writing each result into the tensor that the recording produced, so every later operator
that read that tensor reads the new values. A host read during the capture is an error, as on a GPU.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


# Operators that read a tensor's values on the host (a scalar read, a comparison to a bool) or whose output's size
# depends on them: on a GPU each synchronises, which a capture refuses.
HOST_READS = ('_local_scalar_dense', 'equal', 'is_nonzero', 'allclose', 'nonzero', 'masked_select', '_unique2', 'unique_dim',
              'unique_consecutive', 'repeat_interleave.Tensor')


class CaptureError(RuntimeError):
    """What a CUDA capture raises for an operation it cannot record (here: one that returns a host value)."""


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.storage_offset() == b.storage_offset()
            and a.stride() == b.stride())


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[Any, tuple, dict, list[torch.Tensor]]] = []
        self.made: set[int] = set()     # ids of tensors the recording made.
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id -> (tensor from before, its values)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._schema.name.split('::')[-1] in HOST_READS or str(func).split('aten.')[-1] in HOST_READS:
            raise CaptureError(f'{func} reads tensor values on the host: operation not permitted when stream is capturing')
        # Every tensor from before the capture that an operator sees is saved once: some operators write tensors
        # their schema does not declare mutable (native_batch_norm's running statistics).
        for tensor in tree_flatten((args, kwargs))[0]:
            if isinstance(tensor, torch.Tensor):
                root = tensor if tensor._base is None else tensor._base  # A view's writes land in its base.
                if id(root) not in self.made and id(root) not in self.saved:
                    self.saved[id(root)] = (root, root.clone())
        result = func(*args, **kwargs)
        outputs = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
        self.made.update(id(t) for t in outputs)
        self.ops.append((func, args, kwargs, outputs))
        return result


class EmulatedGraph:
    """The operators of one captured call, replayable."""

    def __init__(self, ops: list) -> None:
        self.ops, self.replays = ops, 0

    def replay(self) -> None:
        with torch.no_grad():
            for func, args, kwargs, outputs in self.ops:
                result = func(*args, **kwargs)
                for out, new in zip(outputs, [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]):
                    if not _same_memory(out, new):
                        out.copy_(new)
        self.replays += 1

    def reset(self) -> None:
        self.ops = []


class EmulatedGraphs:
    """The engine of training/step/graphs.CapturedStep (CudaGraphs' methods), on a CPU."""

    device = torch.device('cpu')

    def __init__(self) -> None:
        self.captures: list[EmulatedGraph] = []

    def run(self, fn: Callable[[], None]) -> None:
        fn()

    def capture(self, fn: Callable[[], None]) -> EmulatedGraph:
        recorder, rng = _Recorder(), torch.get_rng_state()
        try:
            with recorder:
                fn()
        finally:
            with torch.no_grad():
                for tensor, values in recorder.saved.values():
                    if not torch.equal(tensor, values):  # Others keep their version counter, as a GPU leaves them.
                        tensor.copy_(values)
            torch.set_rng_state(rng)
        graph = EmulatedGraph(recorder.ops)
        self.captures.append(graph)
        return graph

    def rng_state(self) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        torch.set_rng_state(state)


def capturable_on_cpu(monkeypatch) -> None:
    """Let torch's optimizers take capturable=True for CPU tensors (they refuse all but accelerators), so that the
    emulated graphs capture the optimizer arithmetic a GPU's graphs capture."""
    import importlib
    for name in ('torch.optim.adam', 'torch.optim.optimizer'):
        module = importlib.import_module(name)
        supported = module._get_capturable_supported_devices
        monkeypatch.setattr(module, '_get_capturable_supported_devices',
                            lambda supports_xla=True, supported=supported: supported(supports_xla) + ['cpu'])
