"""CUDA graphs emulated on a CPU, for the tests of training/step/graphs.py and training/step/training_step.py, with
what a GPU does to them: host synchronisations, a capture that fails inside CUDA, kernels that round differently at
every run, copies from pageable memory.

A CUDA graph runs the Python of a step once, at capture, recording its kernels with the memory they read and
write; a replay runs those kernels again on that memory, and nothing else. So a replayed step goes wrong where
the eager step relies on Python at every call: a learning rate or step number baked in as a host number, a
tensor replaced (x = f(x)) where it should be written in place, an input read from anywhere but the static
buffer, a random draw made outside the step, a host read of a tensor (which capture refuses). `EmulatedGraphs`
gives the same semantics on a CPU: capture records every ATen operator of the step (a TorchDispatchMode sees
the autograd engine's backward operators too) with the tensors it used and made, then undoes what the
recording did to tensors that existed before (and to the random generator); a replay runs the recorded
operators again, writing each result into the tensor that the recording produced, so every later operator
that read that tensor reads the new values.

What CUDA does besides, emulated:
- A host synchronisation (an operator of torch_utils.misc.HOST_READ_OPS, or a copy to the device from pageable
  memory or a blocking one) is seen by CUDA's synchronisation watch in an eager step (`run_watching_syncs` says
  where) and fails a capture inside CUDA, which leaves the process as CUDA leaves it: the capture mode still on,
  so the next random draw fails as the generator of torch 2.5 to 2.11 fails ("Offset increment outside graph
  capture") and every other operator as one on a stream still capturing; `recover()` puts it back, or, made
  with `recoverable=False`, cannot (CudaGraphsBroken).
- `kernel_noise()`: kernels that accumulate in a different order at every run (atomics), as a rounding change of
  one unit in the last place at random positions of the inputs of every reduction, at every call, replays too.
- `CudaAllocatorPools`: the graph pools of CUDA's caching allocator, with their use count (a pool whose graphs
  were all freed is released, and a capture into it fails) and the capture stream's cuBLAS workspace (freed with any
  graph on torch 2.12 and newer, after which a graph that reads it fails at replay), for CudaGraphs itself
  (torch.cuda's calls replaced).
- `emulate_pinned_memory()`: Tensor.pin_memory and is_pinned on a CPU build, so that a copy to another device
  (the tests use 'meta') can be told pinned and asynchronous from pageable or blocking.
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import contextlib
import copy
import os
import traceback
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import dnnlib
from bench.common import module_command
from torch_utils.misc import HOST_READ_OPS
from training.experiment import Experiment
from training.recipes import configs
from training.step.graphs import CudaGraphsBroken

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # The repository.


class CaptureError(RuntimeError):
    """What a CUDA capture raises for an operation it cannot record (here: one that makes the host wait)."""


def _op_name(func) -> str:
    return func._schema.name.split('::')[-1]


def _where() -> str:
    """file:line of the innermost frame of the project's own code (not torch's, not this file's), as CUDA's
    synchronisation watch names the Python line that called the operator."""
    for frame in reversed(traceback.extract_stack()):
        path = os.path.abspath(frame.filename)
        if path.startswith(ROOT) and path != os.path.abspath(__file__):
            return f'{os.path.relpath(path, ROOT)}:{frame.lineno}'
    return '?'


def host_sync(func, args: tuple, kwargs: dict) -> str | None:
    """Why calling func(*args, **kwargs) makes the host wait for the device (None: it does not)."""
    name = _op_name(func)
    if name in HOST_READ_OPS or str(func).split('aten.')[-1] in HOST_READ_OPS:
        return f'{func} reads tensor values on the host'
    if name == '_to_copy' and isinstance(args[0], torch.Tensor) and args[0].device.type == 'cpu':
        target = kwargs.get('device')
        if target is not None and torch.device(target).type != 'cpu':
            if not kwargs.get('non_blocking', False) or not args[0].is_pinned():
                return f'a copy to {target} from pageable memory or a blocking one'
    return None


def _is_random(func) -> bool:
    return torch.Tag.nondeterministic_seeded in func.tags


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.storage_offset() == b.storage_offset()
            and a.stride() == b.stride())


class _SyncWatch(TorchDispatchMode):
    """CUDA's synchronisation watch (torch.cuda.set_sync_debug_mode('warn')): where each host synchronisation happened."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if host_sync(func, args, kwargs) is not None:
            self.syncs.append(_where())
        return func(*args, **kwargs)


def count_syncs(fn: Callable[[], object]) -> int:
    """How many times fn() makes the host wait for the device."""
    with _SyncWatch() as watch:
        fn()
    return len(watch.syncs)


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[Any, tuple, dict, list[torch.Tensor]]] = []
        self.made: set[int] = set()     # ids of tensors the recording made.
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id -> (tensor from before, its values)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        why = host_sync(func, args, kwargs)
        if why is not None:
            raise CaptureError(f'{why}: operation not permitted when stream is capturing')
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


class _StillCapturing(TorchDispatchMode):
    """What a capture that failed inside CUDA leaves behind, until recover(): every operator fails."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _is_random(func):
            raise RuntimeError('Offset increment outside graph capture encountered unexpectedly.')
        raise RuntimeError(f'{func}: operation not permitted when stream is capturing')


class EmulatedGraph:
    """The operators of one captured call, replayable."""

    def __init__(self, ops: list, read: list[torch.Tensor]) -> None:
        self.ops, self.replays = ops, 0
        self.read = read  # The tensors from before the capture that its operators used (what a replay reads).

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

    def __init__(self, recoverable: bool = True) -> None:
        self.captures: list[EmulatedGraph] = []
        self.recoverable = recoverable          # Whether recover() can put the process back after a failed capture.
        self.failed_inside_cuda = False
        self.capturing = False                  # Whether a capture is under way (what a step's Python may look at).
        self.recoveries = 0
        self._still_capturing: _StillCapturing | None = None
        self._rng_before_capture: torch.Tensor | None = None

    def run(self, fn: Callable[[], None]) -> None:
        fn()

    def run_watching_syncs(self, fn: Callable[[], None]) -> list[str]:
        with _SyncWatch() as watch:
            fn()
        return watch.syncs

    def capture(self, fn: Callable[[], None]) -> EmulatedGraph:
        recorder, self._rng_before_capture, self.failed_inside_cuda = _Recorder(), torch.get_rng_state(), False
        self.capturing = True
        try:
            with recorder:
                fn()
        except CaptureError:
            self.failed_inside_cuda = True
            raise
        finally:
            self.capturing = False
            with torch.no_grad():  # The kernels never ran: whatever the recording changed is put back.
                for tensor, values in recorder.saved.values():
                    if not torch.equal(tensor, values):  # Others keep their version counter, as a GPU leaves them.
                        tensor.copy_(values)
            if self.failed_inside_cuda:
                self._still_capturing = _StillCapturing()
                self._still_capturing.__enter__()
            else:
                torch.set_rng_state(self._rng_before_capture)
        graph = EmulatedGraph(recorder.ops, [tensor for tensor, _ in recorder.saved.values()])
        self.captures.append(graph)
        return graph

    def free(self, graph: EmulatedGraph) -> None:
        graph.reset()

    def recover(self) -> None:
        self.recoveries += 1
        if self._still_capturing is not None:  # Also where it "cannot": the tests' own process goes on.
            self._still_capturing.__exit__(None, None, None)
            self._still_capturing = None
        if not self.recoverable:
            raise CudaGraphsBroken('CUDA could not be put back (the random generator: Offset increment outside graph '
                                   'capture encountered unexpectedly.)')
        torch.set_rng_state(self._rng_before_capture)

    def rng_state(self) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        torch.set_rng_state(state)


class kernel_noise(TorchDispatchMode):
    """Kernels that round differently at every run, as those that accumulate with atomics do: at every call of a
    reduction (a convolution's or BatchNorm's backward, a matrix product, a sum), half of the elements of its
    floating-point inputs, drawn at random, move by one unit in the last place up or down (a copy: the tensors
    themselves keep their values), which changes its result by about what another order of summation changes."""

    REDUCTIONS = ('convolution_backward', 'native_batch_norm_backward', 'mm', 'addmm', 'bmm', 'sum')

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.generator = torch.Generator().manual_seed(seed)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _op_name(func) in self.REDUCTIONS:
            args = tuple(self._nudged(a) for a in args)
        return func(*args, **kwargs)

    def _nudged(self, x: Any) -> Any:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.numel() == 0:
            return x
        pick = torch.rand(x.shape, generator=self.generator) < 0.5
        up = torch.rand(x.shape, generator=self.generator) < 0.5
        toward = torch.where(up, torch.full_like(x, float('inf')), torch.full_like(x, float('-inf')))
        return torch.where(pick, torch.nextafter(x, toward), x)


class CudaAllocatorPools:
    """CUDA's graph pools and graphs as training/step/graphs.CudaGraphs drives them (torch.cuda.graph_pool_handle and
    torch.cuda.CUDAGraph replaced; no kernel runs), with the private pools' use count of CUDA's caching allocator: a
    capture into a pool adds one, freeing the graph (reset) takes it back, and a pool whose count reaches 0 is marked to
    be released, after which a capture into it fails the allocator's assert inside CUDA."""

    def __init__(self, monkeypatch, freeing_clears_workspace: bool = False) -> None:
        self.use_count: dict[int, int] = {}     # pool handle -> graphs captured into it and not freed
        self.released: set[int] = set()
        self.captures: list[int] = []           # The pool of each capture begun.
        # The capture stream's cuBLAS workspace, which every graph captured on the stream reads. With
        # freeing_clears_workspace (torch 2.12 and newer), freeing any graph frees it, and the next capture gets a new one.
        self.workspace, self.freed_workspaces = 1, set()
        pools = self

        class Graph:
            def capture_begin(self, pool=None, capture_error_mode='global'):
                pools.captures.append(pool)
                if pool in pools.released:
                    raise RuntimeError('INTERNAL ASSERT FAILED at "CUDACachingAllocator.cpp": it->second->use_count > 0')
                pools.use_count[pool] += 1
                self.pool, self.workspace = pool, pools.workspace

            def capture_end(self):
                pass

            def replay(self):
                if self.workspace in pools.freed_workspaces:
                    raise RuntimeError('CUDA error: an illegal memory access was encountered')

            def reset(self):
                pools.use_count[self.pool] -= 1
                if pools.use_count[self.pool] == 0:
                    pools.released.add(self.pool)
                if freeing_clears_workspace:
                    pools.freed_workspaces.add(pools.workspace)
                    pools.workspace += 1

        def graph_pool_handle():
            handle = len(pools.use_count) + 1
            pools.use_count[handle] = 0
            return handle
        monkeypatch.setattr(torch.cuda, 'Stream', lambda device: 'capture stream')
        monkeypatch.setattr(torch.cuda, 'graph_pool_handle', graph_pool_handle)
        monkeypatch.setattr(torch.cuda, 'CUDAGraph', Graph)
        monkeypatch.setattr(torch.cuda, 'stream', lambda stream: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, 'synchronize', lambda device=None: None)
        monkeypatch.setattr(torch.cuda, 'get_rng_state', lambda device='cuda': torch.zeros(1))
        monkeypatch.setattr(torch.cuda, 'set_rng_state', lambda state, device='cuda': None)


def emulate_pinned_memory(monkeypatch) -> None:
    """Tensor.pin_memory (a copy, marked pinned) and Tensor.is_pinned on a CPU build, which has no pinned memory."""
    def pin_memory(self, device=None):
        copy = self.clone()
        copy.emulated_pinned = True
        return copy
    monkeypatch.setattr(torch.Tensor, 'pin_memory', pin_memory)
    monkeypatch.setattr(torch.Tensor, 'is_pinned', lambda self, device=None: getattr(self, 'emulated_pinned', False))


def capturable_on_cpu(monkeypatch) -> None:
    """Let torch's optimizers take capturable=True for CPU tensors (they refuse all but accelerators), so that the
    emulated graphs capture the optimizer arithmetic a GPU's graphs capture."""
    import importlib
    for name in ('torch.optim.adam', 'torch.optim.optimizer'):
        module = importlib.import_module(name)
        supported = module._get_capturable_supported_devices
        monkeypatch.setattr(module, '_get_capturable_supported_devices',
                            lambda supports_xla=True, supported=supported: supported(supports_xla) + ['cpu'])

#----------------------------------------------------------------------------


class ShortRun:
    """A preset's narrow networks, optimizers and loss, as the training loop builds them, and the plans of a short
    schedule: `steps` G steps (SN-GAN and BigGAN presets, at width 2; D batch 4, 2 from 128x128 up), or gn-stylegan at
    16x16 from 8x8 in phases of 4 G steps of batch 4 (8x8, fade-in, 16x16: Adam resets, a fade-in), or gn-stylegan2 at
    16x16 for 9 G steps of batch 4 (its path length term at steps 0, 4 and 8: warmed up, captured, replayed). What the
    graph tests and bench/graph_check.py run under the emulation."""

    def __init__(self, cfg_name: str, norm: str = 'gn', steps: int = 3) -> None:
        cfg = configs.get_config(cfg_name, norm=norm)
        self.stylegan = cfg.arch == 'stylegan'
        self.resolution = cfg.get('resolution', 16)
        options = dict(kimg=0.048, lod_kimg=0.016, cmax=4, batch=4) if self.stylegan else dict(
            steps=steps, batch=4 if self.resolution < 128 else 2)
        if cfg.arch == 'stylegan2':
            options = dict(steps=9, batch=4, cmax=8, map_dim=16)
        self.experiment = e = Experiment.build(cfg=cfg_name, norm=norm, img_resolution=self.resolution, img_channels=3,
                                               label_dim=10 if cfg.conditional else 0, precision='fp32', aug='noaug',
                                               **options)  # Runs with --aug are not captured (training_step.py).
        width = {} if cfg.arch.startswith('stylegan') else dict(ch=2)
        torch.manual_seed(0)
        self.G = dnnlib.util.construct_class_by_name(**dict(e.G_kwargs, **width)).train().requires_grad_(False)
        self.D = dnnlib.util.construct_class_by_name(**dict(e.D_kwargs, **width)).train().requires_grad_(False)
        self.G_ema = copy.deepcopy(self.G).eval()
        e.arithmetic.lay_out(self.G, self.D)
        self.G_opt = dnnlib.util.construct_class_by_name(params=self.G.parameters(), **e.G_opt_kwargs)
        self.D_opt = dnnlib.util.construct_class_by_name(params=self.D.parameters(), **e.D_opt_kwargs)
        self.loss = dnnlib.util.construct_class_by_name(**e.loss_kwargs, G=self.G, D=self.D, precision=e.arithmetic)
        self.plans, nimg, step = [], 0, 0
        while not e.schedule.done(step, nimg):
            plan = e.schedule.plan(step, nimg)
            self.plans.append(plan)
            nimg, step = nimg + plan.n_dis * plan.batch_D, step + 1

#----------------------------------------------------------------------------

main = module_command(__doc__, 'python -m bench.graph_check')

if __name__ == '__main__':
    main()
