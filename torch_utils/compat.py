"""The PyTorch releases the code runs on: the oldest one, the check every program makes before any work, and the
differences between the supported releases, each handled here and nowhere else.

OLDEST_TORCH is the oldest release supported: CI runs the test suite on it and on the newest release the package
source offers (.ci/run), and requirements.txt and the README name it. It covers two years of releases; torch 2.4
and older also lack `torch.OutOfMemoryError` and `torch.serialization.safe_globals`, which the code uses directly.
What a supported release lacks and how the code gets by:

    missing in        feature                                      handled by
    torch 2.5         ProcessContext.join(grace_period=...)        join_processes: waits out the grace period itself
    torch 2.5         (object, 'module.name') entries of the       named_global: a function carrying the name, which
                      weights_only allow-list                      every release's allow-list accepts
    torch 2.5 - 2.7   a process group's destructor that releases   destroy_process_group: leaves a gloo group to the
                      the GIL (a gloo group could deadlock)        process's end (os._exit)
    torch 2.5 - 2.11  a CUDA generator whose capture mode ends     clear_generator_capture: a fresh generator state
                      when a capture fails (one flag, cleared by   (same seed and offset) replaces the one a failed
                      a successful end of capture only)            capture left in capture mode
    torch 2.12 -      a graph freed without freeing the cuBLAS     training/step/graphs.CudaGraphs.free keeps a graph
                      workspace of its capture stream              freed beside live ones until the last is freed
                                                                   (FREEING_A_GRAPH_CLEARS_STREAM_WORKSPACE)
cuda_graph_repair_missing says what of the repair of a failed capture the running torch lacks (--cuda-graphs=auto then
stays off, and =on is refused). CUDA_GRAPHS_VERIFIED lists the releases on which a GPU passed the CUDA-graph tests
(cuda_graphs_unverified: --cuda-graphs=auto captures on those alone).
"""

from __future__ import annotations

import inspect
import multiprocessing.connection
import re
import sys
import time
from typing import Callable

import torch

#----------------------------------------------------------------------------

OLDEST_TORCH = (2, 5)  # requirements.txt and the README say the same (tests/test_compat.py).


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string: '2.5.1+cu124', '2.6.0a0+git1234' and '2.5.0a0+e00.nv24.10' (a source
    or vendor build of the release's code, before its tag) are all that release."""
    match = re.match(r'(\d+)\.(\d+)', version)
    if match is None:
        raise ValueError(f'"{version}" is not a torch version')
    return int(match.group(1)), int(match.group(2))


def unsupported_reason(version: str) -> str | None:
    """The one line that tells a user their torch `version` is too old, or None when it is supported."""
    if release(version) >= OLDEST_TORCH:
        return None
    oldest = '.'.join(map(str, OLDEST_TORCH))
    return (f'PyTorch {version} is too old: this code needs torch {oldest} or newer (pip install "torch>={oldest}", '
            f'the build for your CUDA driver; requirements.txt)')


def require_supported_torch() -> None:
    """Exit with one line when the torch installed is older than OLDEST_TORCH. The start-up every program imports
    first (torch_utils/startup.py) calls it before the rest of the project is imported, so that an old torch never
    ends in a traceback halfway through a run."""
    reason = unsupported_reason(torch.__version__)
    if reason is not None:
        sys.exit(reason)

#----------------------------------------------------------------------------


_JOIN_HAS_GRACE_PERIOD = 'grace_period' in inspect.signature(torch.multiprocessing.ProcessContext.join).parameters


def join_processes(context: torch.multiprocessing.ProcessContext, grace_period: float) -> bool:
    """`context.join(grace_period=grace_period)`: wait for the processes of `context` (torch.multiprocessing's
    start_processes); when one fails, the others have `grace_period` seconds to end by themselves before they are
    terminated, and ProcessExitedException (or ProcessRaisedException) is raised. True when all have ended well,
    False while some still run. torch 2.5 has no grace_period: its join terminates the others at once, so the
    grace period is waited out here first."""
    if _JOIN_HAS_GRACE_PERIOD:
        return context.join(grace_period=grace_period)
    failed = False
    for sentinel in multiprocessing.connection.wait(list(context.sentinels)):  # Until one process ends.
        process = context.processes[context.sentinels[sentinel]]
        process.join()  # Its exit status is known only once it is reaped: its sentinel is ready a moment before.
        failed = failed or process.exitcode != 0
    if failed:
        deadline = time.monotonic() + grace_period
        for process in context.processes:
            process.join(max(0.0, deadline - time.monotonic()))
    return context.join()


# torch 2.8 releases the GIL in a process group's destructor (pytorch/pytorch#154976). Before, gloo's
# destructor holds the GIL while it joins gloo's worker threads, and a worker that is still releasing the tensor of a
# finished collective, one that Python has already dropped (a temporary), waits for the GIL to free its Python object:
# a deadlock, now and then, at the end of a multi-process CPU run.
_DESTRUCTOR_RELEASES_GIL = release(torch.__version__) >= (2, 8)


def destroy_process_group() -> bool:
    """`torch.distributed.destroy_process_group()` at the end of a process, where torch can do it safely; True when
    done. On torch 2.5 to 2.7 a gloo group is left as it is (False): the caller's process then ends with os._exit,
    which tears nothing down (the interpreter's own exit would destroy the group just the same)."""
    if not _DESTRUCTOR_RELEASES_GIL and torch.distributed.get_backend() == 'gloo':
        return False
    torch.distributed.destroy_process_group()
    return True


def named_global(function: Callable, name: str) -> Callable:
    """An entry of `torch.serialization.safe_globals` that lets a weights_only load call `function` where a pickle
    names it `name` ('module.qualname', e.g. an older library's path of the same function). torch 2.6 and newer
    take the pair (function, name); torch 2.5 finds a global by the __module__ and __name__ of the entries, which
    newer releases also do, so a function carrying the name works on every release."""
    def call(*args, **kwargs):
        return function(*args, **kwargs)
    call.__module__, _, call.__name__ = name.rpartition('.')
    call.__qualname__ = call.__name__
    return call

#----------------------------------------------------------------------------


def load_torchscript(f, map_location: torch.device) -> torch.jit.ScriptModule:
    """torch.jit.load(f), without the FutureWarning that torch 2.14 gives it (`torch.jit.load` is deprecated for
    torch.export): the feature networks of the official metrics are published as TorchScript only."""
    import warnings
    with warnings.catch_warnings():
        warnings.filterwarnings('ignore', message=r'`torch\.jit\.load` is deprecated', category=FutureWarning)
        return torch.jit.load(f, map_location=map_location)


# torch 2.12 keeps a CUDA generator's capture state per capture; 2.5 to 2.11 keep one flag in the generator's state, set
# when a capture begins and cleared only when one ends well. After a capture that failed inside CUDA the flag stays set,
# and every later random draw raises "Offset increment outside graph capture encountered unexpectedly".
GENERATOR_KEEPS_FAILED_CAPTURE = release(torch.__version__) < (2, 12)


def clear_generator_capture(generator: torch.Generator) -> None:
    """Take `generator` (a CUDA device's default generator) out of the capture mode a failed capture left it in, keeping
    its seed and offset: on torch 2.5 to 2.11 its state is replaced by a clone, which copies the seed and the offsets but
    not the flag (graphsafe_set_state and clone_state, both in 2.5); on 2.12 and newer nothing is left to clear."""
    if GENERATOR_KEEPS_FAILED_CAPTURE:
        generator.graphsafe_set_state(generator.clone_state())


# torch 2.12 and newer free the cuBLAS workspaces of the stream a graph was captured on when that graph is freed (pytorch
# issue 193402, open), though every other live graph captured on the same stream still reads them: its next replay, or
# eager work after the memory is reused, reads freed memory. 2.5 to 2.11 keep the workspaces for the process.
FREEING_A_GRAPH_CLEARS_STREAM_WORKSPACE = release(torch.__version__) >= (2, 12)


# The allocator's private call that ends a capture into a graph pool, by its names across releases.
END_ALLOCATE_TO_POOL = ('_cuda_endAllocateToPool', '_cuda_endAllocateCurrentStreamToPool')


def cuda_graph_repair_missing() -> str | None:
    """What the running torch lacks of what training/step/graphs.CudaGraphs.recover needs to put CUDA back after a
    capture that failed inside CUDA, as one phrase (None: nothing): on every release one of the allocator's calls that
    end a capture into a pool (END_ALLOCATE_TO_POOL), and on 2.5 to 2.11 the generator's clone_state and
    graphsafe_set_state (clear_generator_capture)."""
    missing = []
    if not any(hasattr(torch._C, name) for name in END_ALLOCATE_TO_POOL):
        missing.append(f'torch._C.{END_ALLOCATE_TO_POOL[0]}')
    if GENERATOR_KEEPS_FAILED_CAPTURE:
        missing += [f'torch.Generator.{name}' for name in ('clone_state', 'graphsafe_set_state')
                    if not hasattr(torch.Generator, name)]
    return ', '.join(missing) or None


# The torch releases on which `python -m bench.gpu_report --quick` passed the CUDA-graph tests on a GPU (tests/test_graphs.py
# and tests/test_training_step.py with the GPU visible): (major, minor) -> the GPU, the torch build, the date and the
# commit of that run. --cuda-graphs=auto captures only on these; a passing report ends with the line to add here. One
# GPU's run stands for its release on every architecture (nothing in the graphs' code differs by architecture).
CUDA_GRAPHS_VERIFIED: dict[tuple[int, int], str] = {
}


def cuda_graphs_unverified(version: str | None = None) -> str | None:
    """Why --cuda-graphs=auto leaves torch `version` (None: the running one) eager because no GPU run has verified its
    graphs, as one phrase; None where CUDA_GRAPHS_VERIFIED lists its release."""
    major, minor = release(torch.__version__ if version is None else version)
    if (major, minor) in CUDA_GRAPHS_VERIFIED:
        return None
    return (f'no GPU run has verified them on torch {major}.{minor} (--cuda-graphs=on tries them; a passing python -m '
            f'bench.gpu_report --quick ends with the line that adds the release to torch_utils/compat.py\'s '
            f'CUDA_GRAPHS_VERIFIED)')
