"""Which implementation serves an op's call: its CUDA kernel, or its PyTorch reference.

The kernels are built by torch_utils/custom_ops.py; an op holds one LazyPlugin, which
decides per call configuration whether the kernel may serve it.

Fallback. LazyPlugin.get() builds the plugin on first use (custom_ops.get_plugin); a
build that fails for any reason costs one warning, and the op uses its reference from
then on.

Self-check. LazyPlugin.trusted() runs an op's check (compare_to_reference on
random inputs spanning several thread blocks, once more with a launch too small
to cover them so that the kernels' grid-stride and plane loops run; values,
first- and second-order gradients, judged per element) the first time each
(device, dtype, configuration) appears in a process. On disagreement, or on any
error while checking (a launch failure, a CUDA error), it warns once naming the
op, the configuration and the cause, and that configuration uses the reference
implementation from then on; other configurations keep the kernel.
GNGAN_OPS_SELFCHECK=0 switches the check off (for benchmarking).

Choice. LazyPlugin.faster() times a trusted kernel against the reference, forward
and first-order backward, the first time each configuration and shape appears, and
lets the faster one serve it for the rest of the process. The double backward of
GN's D step and of the gradient penalties is not timed, so a kernel kept by this
choice can still be the slower path there. time_call() times the device's work: 20 back-to-back calls queued behind a
spin kernel, so that CUDA events around them see the kernels and not the host's
Python (which, below a few MB, would otherwise decide, and equally for both paths);
median of three rounds after a warm-up. GNGAN_OPS_AUTOTUNE=0, and deterministic algorithms
(--deterministic), always use the kernel, untimed. bench/gpu_report.py lists the choices.

Per call. The ops keep, in LazyPlugin.plans, how they serve each combination of
their arguments' metadata (device, dtype, shape, strides, op settings): a call whose
metadata was seen before costs one dictionary look-up (and marking it used) before the
kernel's launch. The tables per call signature (plans, choices) hold PLAN_CACHE_SIZE
entries at most, the least recently used dropped first.
So the switches above are read when a combination is first seen; to apply a change
to combinations seen before, replace the plugin's verdicts or choices (which drops
its plans).
"""

import collections
import time
import warnings
from typing import Any, Callable, Dict, Hashable, Optional, Sequence, Tuple

import torch

from torch_utils import custom_ops

SELF_CHECK_ENV = 'GNGAN_OPS_SELFCHECK'  # 0: trust the kernels without comparing them with the references
AUTOTUNE_ENV = 'GNGAN_OPS_AUTOTUNE'  # 0: use a trusted kernel without timing it against the reference

# ----------------------------------------------------------------------------
# Self-check.

# Largest accepted error per element (see compare_to_reference), by the kernel's dtype.
SELF_CHECK_TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}


def compare_to_reference(kernel: Callable, reference: Callable, inputs: Sequence[Optional[torch.Tensor]],
                         names: Sequence[str], seed: int = 0) -> Tuple[float, str]:
    """How far kernel(*inputs) is from reference(*inputs in float64), in value, first- and second-order gradients.

    The first-order target sum(r * y^2) makes the incoming gradient depend on the
    inputs, so the second-order pass (target sum(r_i * grad_i)) runs through the
    backward of the backward, as gradient normalization does. r, r_i are drawn
    from a private generator: the global random state is left untouched.
    Returns (worst error, which quantity). Errors are judged per element, against the
    element's own magnitude plus the quantity's root mean square:

        error(q) = max_i |q_kernel[i] - q_reference[i]| / (|q_reference[i]| + rms(q_reference))

    so a wrong small element counts as much as a wrong large one (the RMS term only keeps
    elements at zero crossings, where rounding of the terms dominates, from counting as
    infinitely wrong). NaN counts as the worst error.
    """
    present = [i for i, x in enumerate(inputs) if x is not None]
    device = inputs[present[0]].device
    generator = torch.Generator(device=device)
    results = []
    for fn, dtype in ((reference, torch.float64), (kernel, None)):
        generator.manual_seed(seed)
        args = [None if x is None else x.detach().to(dtype or x.dtype).requires_grad_() for x in inputs]
        diff_args = [args[i] for i in present]
        y = fn(*args)
        r = torch.randn(y.shape, generator=generator, device=device, dtype=torch.float64)
        first = torch.autograd.grad((r * y.double().square()).sum(), diff_args, create_graph=True)
        r_first = [torch.randn(g.shape, generator=generator, device=device, dtype=torch.float64) for g in first]
        second = torch.autograd.grad(sum((g.double() * q).sum() for g, q in zip(first, r_first)), diff_args,
                                     allow_unused=True)
        results.append([y, *first, *second])
    labels = ['value'] + [f'gradient w.r.t. {names[i]}' for i in present] + \
             [f'second-order gradient w.r.t. {names[i]}' for i in present]
    errors = []
    for label, expected, actual in zip(labels, *results):
        expected = torch.zeros([1], device=device) if expected is None else expected.detach().double()
        actual = torch.zeros([1], device=device) if actual is None else actual.detach().double()
        scale = expected.abs() + expected.square().mean().sqrt()
        error = ((actual - expected).abs() / scale.clamp(min=1e-300)).max().item()
        errors.append((error, label))
    return worst_of(errors)


def worst_of(results: Sequence[Tuple[float, str]]) -> Tuple[float, str]:
    """The (error, where) pair with the largest error, NaN counting as the largest."""
    return max(results, key=lambda result: float('inf') if result[0] != result[0] else result[0])

# ----------------------------------------------------------------------------
# Timing.


_spin_cycles_per_ms: Dict[torch.device, float] = {}  # GPU -> clock cycles of torch.cuda._sleep per millisecond


def _spin_rate(device: torch.device) -> float:
    """Cycles per millisecond of the spin kernel torch.cuda._sleep on `device`, measured once."""
    if device not in _spin_cycles_per_ms:
        cycles = 10 ** 7
        torch.cuda._sleep(cycles // 10)  # pylint: disable=protected-access  # warm-up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)  # pylint: disable=protected-access
        end.record()
        end.synchronize()
        _spin_cycles_per_ms[device] = cycles / max(start.elapsed_time(end), 1e-3)
    return _spin_cycles_per_ms[device]


def hold_stream(device: torch.device, ms: float) -> None:
    """Queue a spin kernel that keeps `device`'s current stream busy for about `ms` milliseconds, so that the host can
    queue work behind it and CUDA events around that work time the device alone."""
    torch.cuda._sleep(int(ms * _spin_rate(device)))  # pylint: disable=protected-access


def time_call(fn: Callable[[], Any], device: torch.device, calls: int = 20, rounds: int = 3) -> float:
    """Milliseconds of device work per fn() call: the median of `rounds` of `calls` back-to-back calls, after a warm-up.

    On a GPU, the host first measures how long it takes to queue `calls` calls; then a spin kernel
    (torch.cuda._sleep) holds the stream for twice that plus a millisecond while the host queues
    them again behind it, and CUDA events around the queued calls time the device alone. Without
    the spin, on small tensors the events would time the host's Python and launch overhead, the
    same for both paths whatever their kernels do. On other devices: the wall clock.
    """
    if device.type != 'cuda':
        fn()
        times = []
        for _ in range(rounds):
            start_s = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - start_s) * 1e3 / calls)
        return sorted(times)[len(times) // 2]
    with torch.cuda.device(device):
        for _ in range(3):
            fn()
        torch.cuda.synchronize(device)
        start_s = time.perf_counter()
        for _ in range(calls):
            fn()
        host_ms = (time.perf_counter() - start_s) * 1e3
        torch.cuda.synchronize(device)
        times = []
        for _ in range(rounds):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            hold_stream(device, 2 * host_ms + 1)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / calls)
    return sorted(times)[len(times) // 2]

# ----------------------------------------------------------------------------
# The plugin: built on first use, checked, timed, or replaced by the reference.


def _describe(config: Hashable) -> str:
    """A configuration tuple as one readable line (dataclasses and dtypes print themselves)."""
    return ', '.join(str(part).replace('torch.', '') for part in config) if isinstance(config, tuple) else str(config)


# The most entries of a table kept per call signature (LazyPlugin.plans and .choices, bias_act's checked dims): a
# run's calls have a few hundred signatures (layers x batch shapes x resolutions); a process that keeps meeting new
# shapes (a sweep over batch sizes, a server) drops the least recently used instead of growing without end.
PLAN_CACHE_SIZE = 4096


class LruCache(collections.OrderedDict):
    """A dict of at most `size` entries: storing one more drops the least recently used. A reader marks a hit as
    used with move_to_end(key), a C call, so that the ops' per-call look-up runs no Python function of ours."""

    def __init__(self, entries: Any = (), size: int = PLAN_CACHE_SIZE) -> None:
        self.size = size
        super().__init__(entries)

    def __setitem__(self, key: Hashable, value: Any) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        if len(self) > self.size:
            self.popitem(last=False)


class LazyPlugin:
    """A plugin that an op builds on first use, checks, times, and otherwise replaces by its reference.

    get() tries get_plugin() once per process. If that fails for any reason
    (no CUDA toolkit, CPU-only PyTorch, compiler error), it warns once that the
    op falls back to its slower reference implementation, with the cause and
    the compiler's error lines, and returns None from then on. trusted() runs
    the op's self-check for each new configuration, faster() times the kernel
    against the reference for each new shape (see the module docstring).
    """

    device_type = 'cuda'  # tensors on other devices always take the reference path
    timer = staticmethod(time_call)  # (fn, device) -> milliseconds; the tests install a fake clock

    def __init__(self, op_name: str, module_name: str, sources: Sequence[str], headers: Sequence[str],
                 source_dir: str, **build_kwargs: Any):
        self.op_name = op_name  # name used in the warnings
        self.plugin_args = dict(module_name=module_name, sources=sources, headers=headers, source_dir=source_dir,
                                **build_kwargs)
        self.module = None  # the loaded extension, once built
        self.failed = False  # set after a failed build, so we never retry or warn twice
        self.plans: LruCache = LruCache()  # the op's arguments' metadata -> how it serves them (see the ops)
        self.verdicts: Dict[Hashable, bool] = {}  # configuration -> passed its self-check (or was not checked)
        self.check_results: Dict[Hashable, dict] = {}  # configuration -> error, where, tolerance, milliseconds, cause
        self.choices: LruCache = LruCache()  # configuration and shape -> kernel_ms, reference_ms, kernel

    def __setattr__(self, name: str, value: Any) -> None:
        """The tables per call signature (plans, choices) are LruCaches whatever is assigned to them; those per
        configuration (verdicts, check_results: as many as a network has kinds of layers) plain dicts. Replacing
        the verdicts or the choices, to check or time afresh, drops the plans, which follow from them."""
        if name in ('plans', 'choices') and not isinstance(value, LruCache):
            value = LruCache(value)
        super().__setattr__(name, value)
        if name in ('verdicts', 'choices'):
            super().__setattr__('plans', LruCache())

    def get(self):
        if self.module is None and not self.failed:
            try:
                self.module = custom_ops.get_plugin(**self.plugin_args)
            except Exception as err:  # any build failure means: use the reference implementation
                self.failed = True
                cause, details = (err.cause, err.details) if isinstance(err, custom_ops.BuildError) else \
                    (f'{type(err).__name__}: {" ".join(str(err).split())[:300]}', [])
                hint = '' if custom_ops.env_flag(custom_ops.VERBOSE_BUILD_ENV, '0') else \
                    f' ({custom_ops.VERBOSE_BUILD_ENV}=1 shows the full build log)'
                warnings.warn('\n    '.join([f'{self.op_name}: CUDA kernel unavailable, using the slower reference '
                                            f'implementation{hint}: {cause}', *details]), RuntimeWarning,
                              stacklevel=3)
        return self.module

    def usable(self, device: torch.device) -> bool:
        """Whether tensors on `device` can take the kernel path (the plugin builds, or has been built)."""
        return device.type == self.device_type and self.get() is not None

    def trusted(self, config: Hashable, check: Callable[[], Tuple[float, str]], dtype: torch.dtype) -> bool:
        """Whether the kernel may serve `config` (which includes device and dtype).

        The first time a config appears, check() runs the kernel against the reference
        and returns (error, where). An error above SELF_CHECK_TOLERANCE[dtype], or any
        exception on the way (a launch failure, a CUDA error, a failed allocation), warns
        once and sends this config to the reference for the rest of the process; other
        configs keep the kernel.
        """
        verdict = self.verdicts.get(config)
        if verdict is None:
            verdict = True
            if custom_ops.env_flag(SELF_CHECK_ENV, '1'):
                tolerance = SELF_CHECK_TOLERANCE.get(dtype, 1e-1)
                start = time.perf_counter()
                try:
                    with torch.inference_mode(False), torch.enable_grad(), \
                            torch.autocast(self.device_type, enabled=False):
                        error, where = check()  # ends in .item(): the time includes the device's work
                    cause = None if error <= tolerance else \
                        f'{where} off by {error:.2g} of its magnitude, tolerance {tolerance:g}'
                except Exception as err:  # pylint: disable=broad-except  # whatever failed, the reference works
                    error, where = float('nan'), 'exception'
                    cause = f'{type(err).__name__}: {" ".join(str(err).split())[:300]}'
                self.check_results[config] = dict(error=error, where=where, tolerance=tolerance, cause=cause,
                                                  ms=(time.perf_counter() - start) * 1e3)
                if cause is not None:
                    verdict = False
                    warnings.warn(f'{self.op_name}: the CUDA kernel failed its self-check for {_describe(config)} '
                                  f'({cause}); this configuration uses the reference implementation from now on, '
                                  f'others keep the kernel.', RuntimeWarning, stacklevel=3)
            self.verdicts[config] = verdict
        return verdict

    def faster(self, key: Hashable, kernel: Callable[[torch.Tensor], torch.Tensor],
               reference: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> bool:
        """Whether the kernel is at least as fast as the reference for `key` (a configuration and a shape).

        The first time a key appears, kernel(x) and reference(x) each run forward and
        backward on a copy of x (device time per call, by self.timer: see time_call) and
        the faster one serves the key while it is kept (see LruCache). GNGAN_OPS_AUTOTUNE=0, or deterministic
        algorithms on (a --deterministic run, torch_utils/devices.run_switches): always the kernel, untimed, so that
        two runs never choose differently by a timing (the kernels accumulate without atomics: they repeat bit for
        bit).
        """
        if not custom_ops.env_flag(AUTOTUNE_ENV, '1') or torch.are_deterministic_algorithms_enabled():
            return True
        choice = self.choices.get(key)
        if choice is not None:
            self.choices.move_to_end(key)
        else:
            x = x.detach().clone().requires_grad_()

            def forward_backward(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
                with torch.inference_mode(False), torch.enable_grad(), torch.autocast(x.device.type, enabled=False):
                    y = fn(x)
                    torch.autograd.grad(y, [x], torch.ones_like(y))
            kernel_ms = self.timer(lambda: forward_backward(kernel), x.device)
            reference_ms = self.timer(lambda: forward_backward(reference), x.device)
            choice = self.choices[key] = dict(kernel_ms=kernel_ms, reference_ms=reference_ms,
                                              kernel=kernel_ms <= reference_ms)
        return choice['kernel']
