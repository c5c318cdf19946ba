"""Training steps replayed as CUDA graphs, checked against the eager step like the kernels are.

On a GPU the small networks of this project are bound by the host: a GN D step dispatches hundreds of
operators, each costing the host more than the GPU. A CUDA graph records the kernels of one step once
and replays them with a single launch. `CapturedStep` does that for one kind of step (D or G):

    per graph key (the step's shapes and structure: batch, accumulation rounds, level of detail):
        the first `warmup` calls: the eager step, on the capture stream (lazy initialisation: cuBLAS
            workspaces, cuDNN's algorithm search, the kernels' self-checks and timing, Adam's state)
        then capture: copy the inputs into static buffers, record the step into a graph
        first replay, checked: from the same state (parameters, buffers, optimizer state, divergence flag,
            random generator) run the eager step, then the replay; if every tensor the step changes agrees
            to float rounding, replay from then on, else keep the eager step's result and stay eager
        later calls: copy the inputs into the static buffers, replay

What the step needs to be replayable, the rest of training/step provides: inputs only through the
static buffers; random draws (latents, noise, style mixing, augmentations) from the device's generator
inside the step, which a graph advances at every replay; everything that outlives a step updated in
place (parameters, optimizer state with device-side step counts and learning rates, divergence flag,
statistics through training_stats.flush_into); values that change between steps read from device
tensors (learning rates, the G step's number, the fade-in's lod), never baked in as host numbers; and
no host synchronisation inside the step. Whatever goes wrong (an operator that cannot be captured, a
synchronisation, a disagreement) costs that graph key one line and the eager step, never the run.

A new key frees the graphs of the others (progressive growing never returns to a level it left), so at
most one graph per kind of step holds memory. On a CPU, or with graphs off, the eager step runs as is.
What CUDA provides (a capture stream, graphs, the generator's state) sits in `CudaGraphs`, so that the
tests can run the same machinery on a CPU under an emulation of graphs (tests/graph_emulator.py).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Hashable, Sequence

import torch

import dnnlib
from torch_utils import training_stats

#----------------------------------------------------------------------------

WARMUP_STEPS = 2  # Eager steps of a graph key before its capture.
TOLERANCE = 1e-2  # Largest difference between replay and eager step, per tensor, relative to the step's own change.


@dataclasses.dataclass
class _Graph:
    """The capture of one graph key and where it stands."""
    warmup_left: int                                # Eager steps still to run before the capture.
    graph: torch.cuda.CUDAGraph | None = None       # None: not captured yet.
    inputs: dict[str, torch.Tensor] | None = None   # The static buffers the graph reads.
    checked: bool = False                           # First replay compared with the eager step.


def replay_error(before: Sequence[torch.Tensor], eager: Sequence[torch.Tensor], replayed: Sequence[torch.Tensor]) -> float:
    """max over tensors of max|replayed - eager| / max|eager - before|: how far a replayed step lands from the eager
    one, per tensor relative to how far the eager step moved it (a tensor the eager step left alone must stay)."""
    worst = 0.0
    for b, e, r in zip(before, eager, replayed):
        b, e, r = b.double(), e.double(), r.double()
        moved = (e - b).abs().max()
        off = (r - e).abs().max()
        error = float(off / moved) if moved > 0 else float('inf') if off > 0 else 0.0
        if error != error:  # NaN: a non-finite tensor on either side.
            error = 0.0 if torch.equal(e.nan_to_num(), r.nan_to_num()) else float('inf')
        worst = max(worst, error)
    return worst


def _restore(tensors: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> None:
    """Copy `values` into the tensors that differ from them. The others keep their version counters: a network's
    level of detail is read on the host again whenever its buffer's counter moves (training/networks/stylegan.py)."""
    with torch.no_grad():
        for tensor, value in zip(tensors, values):
            if not torch.equal(tensor, value):
                tensor.copy_(value)


class CudaGraphs:
    """What CapturedStep needs of CUDA: a capture stream (warm-ups run on it too: lazy initialisation belongs
    there), graphs, and the random generator's state, which a capture must leave as it found it (it advances the
    generator without drawing, and a run with graphs must draw what the same run without them draws)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.stream = device, torch.cuda.Stream(device)

    def run(self, fn: Callable[[], None]) -> None:
        """fn() eagerly on the capture stream, ordered after and before the current stream's work."""
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            fn()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)

    def capture(self, fn: Callable[[], None]) -> torch.cuda.CUDAGraph:
        """fn recorded into a graph (nothing runs), the generator's state kept."""
        graph, rng = torch.cuda.CUDAGraph(), self.rng_state()
        try:
            # thread_local: the DataLoader's pinning thread may use CUDA meanwhile; this thread may not synchronise.
            with torch.cuda.graph(graph, stream=self.stream, capture_error_mode='thread_local'):
                fn()
        finally:
            self.set_rng_state(rng)
        return graph

    def rng_state(self) -> torch.Tensor:
        return torch.cuda.get_rng_state(self.device)

    def set_rng_state(self, state: torch.Tensor) -> None:
        torch.cuda.set_rng_state(state, self.device)


class CapturedStep:
    """One kind of training step (D or G), replayed as a CUDA graph per graph key (see the module docstring)."""

    def __init__(self,
        name: str,                                      # 'D' or 'G', for the lines it logs.
        state: Callable[[], list[torch.Tensor]],        # Every tensor a step may change (compared on the first replay).
        engine: CudaGraphs | None,                      # Captures and replays (tests: an emulation); None: always eager.
        log: Callable[[str], None] = print,             # One line per graph key that stays eager, and why.
        warmup: int | None = None,                      # Eager steps of a key before its capture (None: WARMUP_STEPS).
    ) -> None:
        self.name, self.state, self.engine, self.log = name, state, engine, log
        self.warmup = WARMUP_STEPS if warmup is None else warmup
        self.graphs: dict[Hashable, _Graph] = {}
        self.eager_keys: set[Hashable] = set()  # Keys whose capture failed or disagreed.
        self.last_replayed = False  # Whether the last call replayed a graph.

    def __call__(self, key: Hashable, step: Callable[..., None], inputs: dict[str, torch.Tensor]) -> None:
        """One step: step(**inputs), eagerly or by replaying the graph of `key` (whose step it must be)."""
        self.last_replayed = False
        if self.engine is None or key in self.eager_keys:
            step(**inputs)
            return
        entry = self.graphs.get(key)
        if entry is None:
            self.release()  # A new key: the graphs of the others are left for good.
            entry = self.graphs[key] = _Graph(warmup_left=self.warmup)
        if entry.graph is None and entry.warmup_left > 0:
            entry.warmup_left -= 1
            self.engine.run(lambda: step(**inputs))
            return
        if entry.graph is None:
            try:
                entry.inputs = {name: value.clone() for name, value in inputs.items()}
                entry.graph = self._capture(lambda: step(**entry.inputs))
            except Exception as error:  # pylint: disable=broad-except
                self._stay_eager(key, f'could not be captured: {dnnlib.util.first_line(error)}')
                step(**inputs)
                return
        for name, value in inputs.items():
            entry.inputs[name].copy_(value)
        if entry.checked:
            entry.graph.replay()
        else:
            self._check(key, entry, lambda: step(**inputs))
        self.last_replayed = entry.checked

    def release(self) -> None:
        """Free every graph (and its memory pool)."""
        for entry in self.graphs.values():
            if entry.graph is not None:
                entry.graph.reset()
        self.graphs.clear()

    def _capture(self, fn: Callable[[], None]) -> torch.cuda.CUDAGraph:
        """fn recorded into a graph, with its statistics added inside the graph to an accumulator of its own."""
        with training_stats.discarded():  # Whatever a failed capture reported never happened.
            accumulator = training_stats.new_accumulator(self.engine.device)

            def step_and_statistics() -> None:
                fn()
                training_stats.flush_into(accumulator)
            return self.engine.capture(step_and_statistics)

    def _check(self, key: Hashable, entry: _Graph, eager_step: Callable[[], None]) -> None:
        """The first replay against the eager step from the same state; stay eager (with the eager step's result) if
        they disagree."""
        state = self.state()
        before = [t.clone() for t in state]
        rng = self.engine.rng_state()
        with training_stats.discarded():  # The replay's statistics count.
            eager_step()
        eager = [t.clone() for t in state]
        eager_rng = self.engine.rng_state()
        _restore(state, before)
        self.engine.set_rng_state(rng)
        entry.graph.replay()
        error = replay_error(before, eager, state)
        if error <= TOLERANCE:
            entry.checked = True
            return
        _restore(state, eager)
        self.engine.set_rng_state(eager_rng)
        self._stay_eager(key, f'replayed differently from the eager step ({error:.2g} of its change)')

    def _stay_eager(self, key: Hashable, why: str) -> None:
        entry = self.graphs.pop(key, None)
        if entry is not None and entry.graph is not None:
            entry.graph.reset()
        self.eager_keys.add(key)
        self.log(f'CUDA graphs: the {self.name} step {why}; it runs eagerly')
