"""Training steps replayed as CUDA graphs, checked against the eager step like the kernels are.

On a GPU the small networks of this project are bound by the host: a GN D step dispatches hundreds of
operators, each costing the host more than the GPU. A CUDA graph records the kernels of one step once
and replays them with a single launch. `CapturedStep` does that for one kind of step (D or G):

    per graph key (the step's shapes and structure: batch, accumulation rounds, level of detail):
        the first `warmup` calls: the eager step, on the capture stream (lazy initialisation: cuBLAS
            workspaces, cuDNN's algorithm search, the kernels' self-checks and timing, Adam's state);
            the last of them, unless it is also the first (whose one-time work may synchronise), watched
            for host synchronisations, which a capture cannot hold: any one found keeps the key eager,
            with one line naming where it happened
        then capture: copy the inputs into static buffers, record the step into a graph; run the eager step
        first replay, at the next call (new inputs: whatever the capture baked in of this call shows), checked:
            from the same state (parameters, buffers, optimizer state, divergence flag,
            random generator) run the eager step twice, then the replay (the verdict: the worst of every
            process's); the replay passes if every tensor
            lands as close to the first eager result as the tolerance allows plus a margin over how far the
            two eager results lie apart (kernels that accumulate with atomics round differently at every
            run, and Adam turns the rounding noise of a parameter whose true gradient is zero, such as a
            convolution bias before BatchNorm, into a full-sized step); where the kernels are noisy, a
            replay that fails gets a second, independent check (CapturedStep._check); else the first eager
            result is kept and the key stays eager
        later calls: copy the inputs into the static buffers, replay

What the step needs to be replayable, the rest of training/step provides: inputs only through the
static buffers; random draws (latents, noise, style mixing, augmentations) from the device's generator
inside the step, which a graph advances at every replay; everything that outlives a step updated in
place (parameters, optimizer state with device-side step counts and learning rates, divergence flag,
statistics through training_stats.flush_into); values that change between steps read from device
tensors (learning rates, the G step's number, the fade-in's lod), never baked in as host numbers; and
no host synchronisation inside the step. Whatever goes wrong in Python (an operator that cannot be
captured, a disagreement) costs that graph key one line and the eager step, never the run. A capture
that fails inside CUDA leaves CUDA's state half-way (the current stream, the allocator's capture, the
generator); `CudaGraphs.recover` puts it back and checks that the eager step can run, and graphs stay
off for the rest of the process; where CUDA cannot be put back, `CudaGraphsBroken` stops the run with
one line naming --cuda-graphs=off.

D's and G's graphs share one memory pool (they never replay at once, and what outlives a replay, the
parameters, optimizer state, static inputs and statistics, is made outside the captures). Each kind of
step keeps the graphs of its KEYS_KEPT most recently used keys (a step and its lazily regularised
variant, StyleGAN2's), freeing the least recently used for a new one: progressive growing never returns
to a level it left, so its graphs of the levels behind are freed as it grows. On torch 2.12 and newer freeing a
graph frees the cuBLAS workspace of its capture stream, which the other graphs read: there a freed graph is kept
until every graph is freed (`CudaGraphs.free`). On a CPU, or with graphs
off, the eager step runs as is. What CUDA provides (a capture stream, graphs, the generator's state,
the synchronisation watch, the repair) sits in `CudaGraphs`, so that the tests can run the same
machinery on a CPU under an emulation of graphs that also emulates CUDA's failures and
nondeterministic kernels (bench/graph_emulator.py).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Hashable, Sequence

import torch

import dnnlib
from torch_utils import compat, misc, training_stats

#----------------------------------------------------------------------------

WARMUP_STEPS = 2        # Eager steps of a graph key before its capture.
# The first-replay check (replay_error): a replay may land this share of the step's change from the eager step...
TOLERANCE = 1e-2
NOISE_MARGIN = 4.0      # ...plus this many times the difference between two eager runs (the kernels' noise);
NOISE_DOMINATED = 0.1   # a tensor whose two eager runs differ by more than this share of their change is not judged;
NOISY_TOLERANCE = 0.25  # where kernels are noisy, a replay may land this share of the step's change away;
FAILING_SHARE = 0.01    # and of the tensors judged against the noise, the worst holding this share of their elements
                        # are set aside;
ROUNDING_ULPS = 4       # and any tensor may land this many units in the last place of its values away.
CHECK_ROUNDS = 2        # Independent checks a replay may take where kernels are noisy (see CapturedStep._check).
KEYS_KEPT = 2           # Graph keys of one kind of step kept at once (a step and its lazily regularised variant).


class CudaGraphsBroken(RuntimeError):
    """A capture failed inside CUDA and CUDA could not be put back in a state the eager step can use, or graphs were
    asked for (--cuda-graphs=on) where such a failure could not be repaired: the run must stop (the message is one line
    for the user)."""


_off_for_process: str | None = None  # Why graphs are off for the rest of the process (a capture failed inside CUDA).


def off_for_process() -> str | None:
    """Why CUDA graphs are off for the rest of this process, or None while they are not."""
    return _off_for_process


@dataclasses.dataclass
class _Graph:
    """The capture of one graph key and where it stands."""
    warmup_left: int                                # Eager steps still to run before the capture.
    graph: torch.cuda.CUDAGraph | None = None       # None: not captured yet.
    inputs: dict[str, torch.Tensor] | None = None   # The static buffers the graph reads.
    checked: bool = False                           # First replay compared with the eager step.
    statistics: torch.Tensor | None = None          # The accumulator the graph adds its statistics to.


def replay_error(before: Sequence[torch.Tensor], eager: Sequence[torch.Tensor], replayed: Sequence[torch.Tensor],
                 eager_again: Sequence[torch.Tensor] | None = None) -> float:
    """How far a replayed step lands from the eager one, in units of what is allowed: at most 1 passes.

    Per tensor, with moved = max|eager - before|, off = max|replayed - eager| and noise = max|eager_again - eager|
    (eager_again: a second eager run of the same step from the same state; None: deterministic kernels, noise 0):

        noise == 0 (the kernels reproduce it bit for bit):  off / (TOLERANCE * moved + ulps)
        0 < noise <= NOISE_DOMINATED * moved:               off / max(TOLERANCE * moved + NOISE_MARGIN * noise + ulps,
                                                                      NOISY_TOLERANCE * moved)
        noise > NOISE_DOMINATED * moved:                    not judged

    with ulps = ROUNDING_ULPS units in the last place of the tensor's largest value: a change of a few units (a
    weight with a small learning rate) rounds to the same value in two eager runs and to the next in a replay whose
    gradient carries other noise.

    A tensor of the last kind changes by the kernels' noise alone (Adam turning the rounding of a zero gradient into a
    full step, and its moments with it): it tells nothing of the graph. Where kernels are noisy, rounding also flips
    the odd activation across a kink (a ReLU at zero, the hinge), which moves some gradient terms by whole amounts: a
    replay that met other flips than the eager runs lands a few percent of the step's change away (NOISY_TOLERANCE).
    And one pair of eager runs gauges the noise of a tensor of a few elements poorly, so of the tensors of the middle
    kind the worst holding up to FAILING_SHARE of their elements are set aside. A wrong graph (a value baked in, an
    input not copied) moves nearly every tensor by about its whole change or more. The result is the largest error of
    what is left; a tensor that neither eager run moved may move by those few units in the last place at most."""
    worst, noisy = 0.0, []  # noisy: (error, elements) of the tensors judged against the kernels' noise.
    for index, (b, e, r) in enumerate(zip(before, eager, replayed)):
        eps = torch.finfo(e.dtype).eps if e.is_floating_point() else 0.0
        b, e, r = b.detach().double(), e.detach().double(), r.detach().double()
        moved, off = (e - b).abs().max(), (r - e).abs().max()
        noise = 0.0 if eager_again is None else (eager_again[index].detach().double() - e).abs().max()
        if noise > NOISE_DOMINATED * moved:
            continue
        allowed = TOLERANCE * moved + NOISE_MARGIN * noise + ROUNDING_ULPS * eps * e.abs().max()
        if noise > 0:
            allowed = max(allowed, NOISY_TOLERANCE * moved)
        error = float(off / allowed) if allowed > 0 else float('inf') if off > 0 else 0.0
        if error != error:  # NaN: a non-finite tensor on either side.
            error = 0.0 if torch.equal(e.nan_to_num(), r.nan_to_num()) else float('inf')
        if noise > 0:
            noisy.append((error, e.numel()))
        else:
            worst = max(worst, error)
    set_aside = FAILING_SHARE * sum(n for _, n in noisy)
    for error, n in sorted(noisy, reverse=True):
        if n > set_aside:
            return max(worst, error)
        set_aside -= n
    return worst


def _agreed(error: float, noisy: bool) -> tuple[float, bool]:
    """The verdict of every process of a run: the largest error and whether any process's kernels were noisy. Each
    process checks its own replay, from its own state (gn-stylegan2's path length mean, for one, is its own): were their
    verdicts to differ, some would replay and some not, and their parameters would drift apart."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1):
        return error, noisy
    device = 'cuda' if torch.distributed.get_backend() == 'nccl' else 'cpu'
    verdict = torch.tensor([error, float(noisy)], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(verdict, op=torch.distributed.ReduceOp.MAX)
    return float(verdict[0]), bool(verdict[1] > 0)


def restore(tensors: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> None:
    """Copy `values` into the tensors that differ from them. The others keep their version counters: a network's
    level of detail is read on the host again whenever its buffer's counter moves (training/networks/stylegan.py)."""
    with torch.no_grad():
        for tensor, value in zip(tensors, values):
            if not torch.equal(tensor, value):
                tensor.copy_(value)


class CudaGraphs:
    """What CapturedStep needs of CUDA: a capture stream (warm-ups run on it too: lazy initialisation belongs
    there), one memory pool for the graphs of D and G (they never replay at once), a watch for host
    synchronisations, graphs, the random generator's state (a capture must leave it as it found it: it advances the
    generator without drawing, and a run with graphs must draw what the same run without them draws), and the
    repair of a capture that failed inside CUDA."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.stream = device, torch.cuda.Stream(device)
        self.pool = None  # The shared pool, made for the first capture and again whenever every graph in it was freed.
        self.live = 0     # Graphs captured into the pool and not freed.
        self.retired: list[torch.cuda.CUDAGraph] = []  # Freed by their steps, kept until every graph is (see free).
        self.failed_inside_cuda = False  # Whether the last capture failed in CUDA (recover() before the eager step).
        self.rng_before_capture: torch.Tensor | None = None

    def run(self, fn: Callable[[], None]) -> None:
        """fn() eagerly on the capture stream, ordered after and before the current stream's work."""
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            fn()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)

    def run_watching_syncs(self, fn: Callable[[], None]) -> list[str]:
        """run(fn), returning where each operation that made the host wait for the GPU happened (a capture would fail
        on it): CUDA's synchronisation watch (torch_utils.misc.cuda_syncs_of)."""
        return misc.cuda_syncs_of(lambda: self.run(fn))

    def capture(self, fn: Callable[[], None]) -> torch.cuda.CUDAGraph:
        """fn recorded into a graph in the shared pool (nothing runs), the generator's state kept. The capture is
        driven here rather than by torch.cuda.graph, whose exit leaves the capture stream current when the capture
        fails; `failed_inside_cuda` says whether CUDA ended the capture with an error."""
        graph = torch.cuda.CUDAGraph()
        if self.live == 0:
            # Once the last graph in a pool is freed, CUDA's allocator marks the pool to be released, and a capture
            # into it again fails its assert (use_count > 0), inside CUDA on torch 2.11 and older: a fresh pool.
            self.pool = torch.cuda.graph_pool_handle()
        self.rng_before_capture, self.failed_inside_cuda = self.rng_state(), False
        torch.cuda.synchronize(self.device)
        try:
            with torch.cuda.stream(self.stream):
                # thread_local: the DataLoader's pinning thread may use CUDA meanwhile; this thread may not synchronise.
                graph.capture_begin(self.pool, capture_error_mode='thread_local')
                try:
                    fn()
                finally:
                    try:
                        graph.capture_end()
                    except Exception:
                        self.failed_inside_cuda = True
                        raise
        finally:
            if not self.failed_inside_cuda:  # Else recover() restores it, once the generator is known to work.
                self.set_rng_state(self.rng_before_capture)
        self.live += 1
        return graph

    def free(self, graph: torch.cuda.CUDAGraph) -> None:
        """Free a graph from capture(): its share of the pool returns to the pool. On torch 2.12 and newer freeing a
        graph also frees the cuBLAS workspace of the stream it was captured on, which every other graph here (one
        capture stream) still reads (compat.FREEING_A_GRAPH_CLEARS_STREAM_WORKSPACE): there a graph freed while others
        live is only retired, and the retired graphs are freed with the last live one, when none is left to read the
        workspace. Their memory stays taken until then (at most the graphs of the keys a run has left since)."""
        self.live -= 1
        if compat.FREEING_A_GRAPH_CLEARS_STREAM_WORKSPACE and self.live > 0:
            self.retired.append(graph)
            return
        for freed in self.retired + [graph]:
            freed.reset()
        self.retired = []

    def recover(self) -> None:
        """After a capture that failed inside CUDA: end what the capture left (the allocator's capture into the pool,
        the capture streams, on torch 2.5 to 2.11 the generator's capture mode: compat.clear_generator_capture), then
        check, by doing it, that what the eager step needs works: the current stream is the
        one before the capture, no stream is capturing, the generator draws and restores, the allocator frees its
        cache, the device runs and synchronises. Raises CudaGraphsBroken where it does not."""
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        compat.clear_generator_capture(torch.cuda.default_generators[index])
        for name in compat.END_ALLOCATE_TO_POOL:
            end_allocation = getattr(torch._C, name, None)  # Private, and named differently across releases.
            if end_allocation is not None:
                try:
                    end_allocation(index, self.pool)
                except Exception:  # pylint: disable=broad-except
                    pass  # The capture's end had done it; the checks below tell.
        checks = [
            ('the capture stream still current', lambda: torch.cuda.current_stream(self.device) != self.stream),
            ('a stream still capturing', lambda: not any(self._capturing(stream) for stream in (self.stream, torch.cuda.current_stream(self.device)))),
            ('the random generator', self._draws),
            ('the allocator', lambda: torch.cuda.empty_cache() is None),
            ('the device', lambda: bool(torch.ones(1, device=self.device).add_(1).sum().item() == 2)),
        ]
        for what, check in checks:
            try:
                usable = check()
            except Exception as error:  # pylint: disable=broad-except
                raise CudaGraphsBroken(f'CUDA could not be put back ({what}: {dnnlib.util.first_line(error)})') from None
            if not usable:
                raise CudaGraphsBroken(f'CUDA could not be put back ({what})')
        self.set_rng_state(self.rng_before_capture)

    @staticmethod
    def _capturing(stream: torch.cuda.Stream) -> bool:
        with torch.cuda.stream(stream):
            return torch.cuda.is_current_stream_capturing()

    def _draws(self) -> bool:
        state = self.rng_state()
        torch.randn(1, device=self.device)
        self.set_rng_state(state)
        return torch.equal(self.rng_state(), state)

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
        self.graphs: collections.OrderedDict[Hashable, _Graph] = collections.OrderedDict()  # Least recently used first.
        self.eager_keys: set[Hashable] = set()  # Keys whose capture failed or disagreed.
        self.last_replayed = False  # Whether the last call replayed a graph.

    def __call__(self, key: Hashable, step: Callable[..., None], inputs: dict[str, torch.Tensor]) -> None:
        """One step: step(**inputs), eagerly or by replaying the graph of `key` (whose step it must be)."""
        self.last_replayed = False
        if _off_for_process is not None and self.graphs:
            self.release()
        if self.engine is None or key in self.eager_keys or _off_for_process is not None:
            step(**inputs)
            return
        entry = self.graphs.get(key)
        if entry is None:
            while len(self.graphs) >= KEYS_KEPT:  # The least recently used key's graph is freed.
                self._free(self.graphs.pop(next(iter(self.graphs))))
            entry = self.graphs[key] = _Graph(warmup_left=self.warmup)
        self.graphs.move_to_end(key)
        if entry.graph is None and entry.warmup_left > 0:
            entry.warmup_left -= 1
            if entry.warmup_left > 0 or self.warmup == 1:  # The first does one-time work, which may synchronise.
                self.engine.run(lambda: step(**inputs))
                return
            syncs = self.engine.run_watching_syncs(lambda: step(**inputs))  # The last warm-up, not the first.
            if syncs:
                self._stay_eager(key, f'makes the host wait for the GPU ({", ".join(sorted(set(syncs)))})')
            return
        if entry.graph is None:
            try:
                entry.inputs = {name: value.clone() for name, value in inputs.items()}
                entry.graph, entry.statistics = self._capture(lambda: step(**entry.inputs))
            except Exception as error:  # pylint: disable=broad-except
                self._capture_failed(key, error)
            step(**inputs)  # The first replay is checked at the next call, on new inputs: what the capture baked in shows.
            return
        for name, value in inputs.items():
            entry.inputs[name].copy_(value)
        if entry.checked:
            entry.graph.replay()
        else:
            self._check(key, entry, lambda: step(**inputs))
        self.last_replayed = entry.checked

    def release(self) -> None:
        """Free every graph (its share of the pool returns to the pool)."""
        for entry in self.graphs.values():
            self._free(entry)
        self.graphs.clear()

    def _free(self, entry: _Graph) -> None:
        if entry.graph is not None:
            self.engine.free(entry.graph)
            entry.graph = None

    def _capture(self, fn: Callable[[], None]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """fn recorded into a graph, with its statistics added inside the graph to an accumulator of its own (returned
        with the graph)."""
        with training_stats.discarded():  # Whatever a failed capture reported never happened.
            accumulator = training_stats.new_accumulator(self.engine.device)

            def step_and_statistics() -> None:
                fn()
                training_stats.flush_into(accumulator)
            return self.engine.capture(step_and_statistics), accumulator

    def _capture_failed(self, key: Hashable, error: Exception) -> None:
        """A capture that failed in Python costs its key; one that failed inside CUDA, once CUDA is put back, costs
        graphs for the rest of the process (CudaGraphsBroken, to stop the run, where it cannot be put back)."""
        why = dnnlib.util.first_line(error)
        if not self.engine.failed_inside_cuda:
            self._stay_eager(key, f'could not be captured: {why}')
            return
        global _off_for_process  # pylint: disable=global-statement
        try:
            self.engine.recover()
        except CudaGraphsBroken as broken:
            raise CudaGraphsBroken(f'CUDA graphs: the capture of the {self.name} step failed inside CUDA ({why}), {broken}; '
                                   f'the run stopped: continue it from its last snapshot with --resume=latest '
                                   f'--cuda-graphs=off') from None
        self.release()
        _off_for_process = f'the capture of the {self.name} step failed inside CUDA ({why})'
        self.log(f'CUDA graphs: {_off_for_process}; CUDA was put back, and every step runs eagerly from now on')

    def _check(self, key: Hashable, entry: _Graph, eager_step: Callable[[], None]) -> None:
        """The first replay against the eager step, run twice from the same state (replay_error); stay eager (with the
        first eager result) if they disagree.

        Where the kernels are noisy, a replay that disagrees gets CHECK_ROUNDS independent checks from the same state
        (two more eager runs, another replay) and passes if one of them passes. Rounding noise flips the odd activation
        across a kink (a ReLU at zero, the hinge), which moves some gradient terms by whole amounts; a replay that met
        such a flip when neither eager run did lands beyond what their spread allows, by chance: a correct graph fails
        one check with a small probability p and CHECK_ROUNDS of them with p ** CHECK_ROUNDS. A wrong graph (a value
        baked in, an input not copied) lands as far at every replay and fails every check. With deterministic kernels
        (the two eager runs agree bit for bit) one check decides: its replay would land the same at every try."""
        state = self.state()
        before = [t.clone() for t in state]
        rng = self.engine.rng_state()
        statistics = entry.statistics.clone() if entry.statistics is not None else None
        eager = eager_rng = None
        for _ in range(CHECK_ROUNDS):
            with training_stats.discarded():  # The replay's statistics count.
                eager_step()
                first, first_rng = [t.clone() for t in state], self.engine.rng_state()
                restore(state, before)
                self.engine.set_rng_state(rng)
                eager_step()
            again = [t.clone() for t in state]
            if eager is None:
                eager, eager_rng = first, first_rng  # Kept where the graph is rejected.
            restore(state, before)
            self.engine.set_rng_state(rng)
            if statistics is not None:
                entry.statistics.copy_(statistics)  # A replay that was not kept added nothing.
            entry.graph.replay()
            error, noisy = _agreed(replay_error(before, first, state, again),
                                   not all(torch.equal(a, b) for a, b in zip(first, again)))
            if error <= 1:
                entry.checked = True
                return
            if not noisy:
                break  # Deterministic kernels: another replay would land as far.
            restore(state, before)
            self.engine.set_rng_state(rng)
        restore(state, eager)  # With the statistics of the last replay.
        self.engine.set_rng_state(eager_rng)
        self._stay_eager(key, f'replayed differently from the eager step ({error:.2g} times what its tolerance and the '
                              f'eager runs\' own spread allow)')

    def _stay_eager(self, key: Hashable, why: str) -> None:
        entry = self.graphs.pop(key, None)
        if entry is not None:
            self._free(entry)
        self.eager_keys.add(key)
        self.log(f'CUDA graphs: the {self.name} step {why}; it runs eagerly')
