"""One command for whoever has a GPU: build, self-check, the whole test suite, op and training benchmarks, and a
time-boxed GN-StyleGAN run on the embedded digits, scored; one report, kept up to date as the steps end.

    python -m bench.gpu_report --quick                  # planned at most 360 s on one H100/H200
    python -m bench.gpu_report --outdir=h100-report     # more repeats, configurations and training time
    python -m bench.gpu_report --quick --rehearse       # on a CPU: every step of the quick plan at its smallest size

Budget. The whole run is bounded by --budget seconds, counted from the start of the process (--quick: 360,
the sum of its steps' plans below; the full run: the sum of its plans). A GPU is often lent for a fixed time
with a retry after it, so the run must end inside the budget and keep whatever it measured: the steps run
in order of value, each inside a time box, and each step's result is written into report.json and report.md
(and its log into logs.tar.gz) as soon as the step ends. A step's box is its planned seconds, plus whatever
the earlier steps left unused beyond the plans of the later ones; never more than the budget left (less 2 s
kept for writing the last report). A step whose box runs out is stopped there (a subprocess with its whole
process group: SIGTERM, or SIGINT for pytest, which then still writes the results of the tests that
finished; SIGKILL after a few seconds' grace; an in-process step between two of its measurements) and
recorded as stopped at its time box, with what it had measured. A step that would get less than half its
plan is not started ("not run: budget spent"). SIGTERM or SIGINT to this process ends the running step's
subprocesses too, records that step as stopped by the signal and the rest as not run, writes the report
and exits with status 128 + the signal's number. An exception in gpu_report itself (a crash) is recorded
with its traceback in logs.tar.gz; the steps after it are listed as not run because that step crashed. A
step whose prerequisite did not succeed (no GPU, this torch without CUDA, the plugins not built) is listed
as not run, with that reason. report.md lists each step's planned, boxed and taken seconds, so that the
plans below can follow what a GPU measured; the boxes keep the run inside its budget whatever the steps take.

Steps, in order of value, with their planned seconds (--quick / full run):

  step            planned s     what, and why at this place
  environment       5 /    5    torch and CUDA versions, the GPUs, the CUDA toolkit custom_ops finds and the
                                architectures it builds for: every number below is read against it.
  build            60 /  300    both plugins through torch_utils/custom_ops.py, each built in its own
                                subprocess, the two at once (a fresh build is 30-60 s each for one
                                architecture on 16 cores), then loaded here from custom_ops' cache. A fresh
                                build needs an empty TORCH_EXTENSIONS_DIR; otherwise this times the load of
                                the cached one. Whether the kernels build for this GPU is the first thing only
                                a GPU machine shows, and every later step uses them.
  first tests      70 /    -    --quick: the tests marked gpu and those of tests/test_graphs.py,
                                test_training_step.py and test_ops_gpu.py (the captured training steps,
                                their first-replay check, the kernels on the device), collected once with the
                                GPU visible, pytest-xdist as below: what only a GPU can show, before any timing.
  self-check       10 /   30    the kernels' first-use self-check for the configurations the networks use
                                (every activation of bias_act; the [1,2,1], box and [1,3,3,1] resampling of
                                upfirdn2d) in float32, float16 and bfloat16: measured error against the
                                float64 reference (per element, see kernel_choice), tolerance, milliseconds,
                                cause of a failure. Correctness on the device before any speed.
  choices          10 /   60    the chooser's decision, kernel or reference, with both timings, for the
                                activation and resampling StyleGAN runs at 8x8 ... 1024x1024 with its
                                channel counts, in each dtype: what the kernels are worth, in seconds.
  test suite        - /  900    python -m pytest on the whole suite with the GPU visible (pytest-xdist, one
                                worker per core, at most 16; 232 s on an H200 with 16 cores in the first GPU
                                run): counts, failures by name, wall time. A failure
                                weighs more than any timing below.
  test sample      50 /    -    --quick: a sample of the other tests, as many as the step's box holds at the
                                first GPU run's 2.1 worker-seconds a test after 15 s of start (every file
                                once before any file twice, the same sample at every run).
  ops              15 /  300    bench/ops.py: kernels against references, each case checked before timing,
                                GB/s against the kernels' targets (--quick: the network cases at 8 and 32 px).
  training speed   30 /  400    bench/train_speed.py, cifar10-resnet, GN and no constraint (the paper's speed
                                comparison) at tf32 and bf16, each replayed as CUDA graphs and eager (full run:
                                also fp32, both GN D-step forms, one or two D calls), with each configuration's
                                peak GPU memory and its host and device time per step; with --authors-code, the
                                authors' steps in the same rounds.
  (full run only)   - /  120    the same with --deterministic: what repeatable GPU arithmetic costs.
  digits step      15 /   60    bench/train_speed.py, gn-stylegan on the digits' 32x32 at --cmax=32 and batch
                                32, graphs and eager: the CPU-scale quick start's step on a GPU.
  precision        10 /   60    bench/precision.py on the GPU: GN's and the unconstrained D's gradient against
                                float64 at fp32, tf32 and bf16, with GN's D step affine and plain, for
                                cifar10-cnn and cifar10-resnet: the figures docs/precision.md's GPU
                                recommendation waits for.
  presets          35 /  300    every SN-GAN and BigGAN preset with GN at tf32 and bf16, as train.py runs them
                                (CUDA graphs where they pass; --quick: one round): the GPU time of
                                docs/reproduce.md.
  (full run only)   - /   60    bench/train_speed.py --augs: what ADA's bgc pipeline and DiffAugment cost a GN
                                step of gn-stylegan2 at 256x256 and of cifar10-resnet, against no augmentation.
  gn-stylegan      25 /  300    bench/stylegan.py: GN-StyleGAN D+G steps at 256x256 and at 1024x1024 with v1's
                                per-GPU batch of 4, each with the kernels and with the reference ops (what the
                                chooser's choices are worth in a real step), each with its own peak memory.
  (full run only)   - /  600    bench/train_speed.py for gn-stylegan at 256x256: GN and no constraint, every
                                precision;
  (full run only)   - /  300    and at 1024x1024 with batch 4, tf32 and bf16.
  (full run only)   - /  300    bench/stylegan2.py: gn-stylegan2 (NVIDIA's StyleGAN2 networks, GN D) iterations at
                                256x256 and 1024x1024 with one GPU's share of NVIDIA's 8-GPU batch, at tf32, bf16
                                and fp16 (their float16 top resolutions), each with the kernels and with the
                                reference ops, each with its peak memory.
  digits           25 /  750    train.py's GN-StyleGAN command for the embedded digits at full width, stopped
                                after a time box (what the step's box leaves after 15 s kept for scoring, at
                                most 60 s with --quick and 600 s in the full run), its last snapshot scored by
                                bench/quickstart_quality.py on the GPU, and its last image grid. The whole
                                training pipeline on the GPU, but the least precise figure in a short box: last.
  (full run only)   - /  420    bench/compare.py: docs/results.md's gn-stylegan2 comparison on the digits (GN,
                                NVIDIA's R1 and no constraint, its CPU-sized networks, 60 kimg each, seed 0)
                                on the GPU, every run that ends in the box scored, the final samples.
  total           360 / 5265

The report ends with the targets of the training step (CUDA graphs) on one H100/H200, each measured value
against its bound: the cifar10-resnet iteration with graphs at most 0.45x the authors' code with GN and 0.5x
without a constraint (needs --authors-code), GN's cost over no constraint at most 1.4x, bf16 faster than tf32
for every SN-GAN and BigGAN preset, the --cmax=32 digits step at most 20 ms. Then, where the graph tests passed (the
step that ran tests/test_graphs.py and tests/test_training_step.py with the GPU visible ended with none failed),
the line to add to torch_utils/compat.py's CUDA_GRAPHS_VERIFIED: --cuda-graphs=auto captures only on those releases.

The rehearsal (--rehearse; --quick: the quick plan, else the full one): every step on this CPU, with the same
command lines at the smallest sizes they take (REHEARSAL_* below: one timed round, narrow networks, a few digits
steps scored on a few images, the first test of REHEARSAL_TESTS files), each reported ok or failed with the last
line of its log; what only CUDA does is named as skipped: the build, the self-check and the chooser (whole steps),
bench/ops.py and bench/stylegan.py (their command lines parsed by their own parsers, not run), the CUDA-graph rows,
CUDA events and peak memory, the tests marked gpu. So a lent GPU never meets a Python error a CPU could have shown.

Without a GPU the report says "no GPU" for the steps after the build and still records the environment and
the build (with a CUDA build of torch, the real build). --outdir receives at most five files: report.md
(meant for the project's records), report.json (the same data), logs.tar.gz (every step's log),
digits-fakes.png and (full run) digits-stylegan2.png. Exit status 1 if a step that ran failed, crashed or was stopped at its time box.
"""

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import contextlib
import dataclasses
import datetime
import glob
import importlib.util
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
import xml.etree.ElementTree as ET
from typing import Callable, Dict, Iterator, List, Optional, Sequence
from unittest import mock

import click
import psutil
import torch

import dnnlib
from ops import bias_act, upfirdn2d
from torch_utils import compat, custom_ops, kernel_choice

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # The repository: children run there.
PLUGINS = {'bias_act': bias_act._plugin, 'upfirdn2d': upfirdn2d._plugin}  # pylint: disable=protected-access
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# The digits at full width on a GPU: README's GN-StyleGAN digits command without the CPU's --cmax/--batch.
DIGITS_COMMAND = ['train.py', '--cfg=gn-stylegan', '--data=data/digits32.zip', '--lod-kimg=8', '--kimg=160', '--xflip=0',
                  '--tanh=1', '--tick=2', '--snap=2']
DIGITS_TRAINING_MAX = {True: 60, False: 600}  # Most seconds of digits training, by --quick.
DIGITS_SCORING = 15  # Seconds of the digits step kept for scoring the last snapshot.
# docs/results.md's comparison of GN, NVIDIA's R1 and no constraint in gn-stylegan2 on the digits (its CPU-sized
# networks and length), seed 0, on the GPU; without augmentation, as the CPU's record of it was trained.
SG2_DIGITS_COMPARE = ['-m', 'bench.compare', '--cfg=gn-stylegan2', '--settings=gn:hinge,r1:ns,none:ns', '--seeds=0',
                      '--kimg=60', '--snaps=6', '--num=1000', '--augs=noaug']
SG2_DIGITS_EXTRA = '--cmax=16 --map-dim=32 --batch=32'
OUTPUTS = ('report.md', 'report.json', 'logs.tar.gz', 'digits-fakes.png', 'digits-stylegan2.png')  # All of --outdir.
REPORT_RESERVE = 2  # Seconds of the budget kept for writing the last report.
STOP_GRACE = 5  # Seconds a stopped subprocess gets to end before SIGKILL.
# How the test suite is stopped at its box: SIGINT to pytest alone (its xdist workers are its to end), which then
# writes the results of the tests that finished, with 10 s for that before SIGKILL.
SUITE_STOP = dict(stop=signal.SIGINT, grace=10, leader_only=True)


class Stopped(BaseException):
    """SIGTERM or SIGINT reached this process (a BaseException: no step's `except Exception` swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def process_start() -> float:
    """The time.monotonic() of this process's start: the budget counts from there, torch's import included."""
    return time.monotonic() - (time.time() - psutil.Process().create_time())


def _has_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


# ----------------------------------------------------------------------------
# Subprocesses: each in its own process group, stopped with it.


def _take_stop_signals() -> None:
    """In a child before it runs: SIGINT and SIGTERM as the program sets them, not ignored as they are inherited from a
    parent started in the background by a non-interactive shell (pytest that ignores SIGINT writes no report)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


class Child:
    """A subprocess of the repository root in its own process group (so that stopping it also stops what it
    started), its output into a log."""

    def __init__(self, command: Sequence[str], log_path: str) -> None:
        self.command, self.log_path, self.start = list(command), log_path, time.monotonic()
        self.log_name = os.path.basename(log_path)
        with open(log_path, 'w') as log:
            self.process = subprocess.Popen(self.command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True, preexec_fn=_take_stop_signals)

    def wait(self, deadline: float, stop: int = signal.SIGTERM, grace: float = STOP_GRACE,
             leader_only: bool = False) -> Optional[int]:
        """The exit status, or None when the child was stopped at `deadline` (`stop` to the group, or to the
        leader alone, `grace` seconds before it). Whatever interrupts the wait (SIGTERM to this process, a crash)
        stops the child first."""
        try:
            try:
                return self.process.wait(timeout=max(deadline - grace - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                self.stop(stop, grace, leader_only)
                return None
        except BaseException:
            self.stop(signal.SIGTERM, STOP_GRACE)
            raise

    def stop(self, stop: int, grace: float, leader_only: bool = False) -> None:
        """`stop` to the process group (or its leader), SIGKILL to whatever of the group remains after `grace`."""
        with contextlib.suppress(ProcessLookupError):
            (os.kill if leader_only else os.killpg)(self.process.pid, stop)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def result(self, returncode: Optional[int]) -> dict:
        with open(self.log_path, 'rb') as f:
            lines = [line.strip() for line in f.read()[-4096:].decode(errors='replace').splitlines() if line.strip()]
        return dict(command=' '.join(self.command[1:]), returncode=returncode, seconds=time.monotonic() - self.start,
                    stopped_at_box=returncode is None, ok=returncode == 0, log=f'logs.tar.gz: {self.log_name}',
                    last_line=lines[-1][:300] if lines else '')


def run_child(command: Sequence[str], log_path: str, box: float, **stop_kwargs) -> dict:
    """`command` run for at most `box` seconds (see Child.wait); its status, seconds and log."""
    child = Child(command, log_path)
    return child.result(child.wait(time.monotonic() + box, **stop_kwargs))


def _json_bench(module: str, args: List[str], workdir: str, name: str, box: float) -> dict:
    """A bench program (`module`, e.g. 'bench.ops') that writes --out=JSON, run in a subprocess; its JSON under 'data'."""
    json_path = os.path.join(workdir, f'{name}.json')
    result = run_child([sys.executable, '-m', module, f'--out={json_path}', *args], os.path.join(workdir, f'{name}.log'), box)
    if os.path.isfile(json_path):
        with open(json_path) as f:
            result['data'] = json.load(f)
    return result


# ----------------------------------------------------------------------------
# The steps.


@dataclasses.dataclass
class Context:
    """What a step works with: the working folder (logs, JSON), the output folder, the run's mode, and the running
    step's key and the end of its box."""
    workdir: str
    outdir: str
    quick: bool
    authors_code: Optional[str] = None  # A checkout of the authors' code (bench/authors.py), or None.
    rehearse: bool = False  # --rehearse: every step on this CPU at the smallest size its command takes.
    tests: Optional[List[dict]] = None  # The suite's tests once collected (collect_tests).
    key: str = ''
    deadline: float = 0.0  # time.monotonic() at which the running step's box ends


def environment(ctx: Context) -> dict:
    cuda_home, tried = custom_ops.find_cuda_home()
    arch_list = None  # n/a without a CUDA build of torch or a toolkit
    if cuda_home is not None and torch.version.cuda is not None:
        try:
            arch_list = custom_ops.cuda_arch_list(os.path.join(cuda_home, 'bin', 'nvcc'))
        except custom_ops.BuildError as err:
            arch_list = f'none ({err.cause})'
    gpus = []
    if _has_gpu():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            gpus.append(dict(name=props.name, capability=f'{props.major}.{props.minor}',
                             memory_gib=round(props.total_memory / 2 ** 30, 1)))
    return dict(ok=True, date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
                platform=platform.platform(), python=platform.python_version(), torch=torch.__version__,
                torch_cuda=torch.version.cuda, gpus=gpus, cuda_home=cuda_home, cuda_home_rejected=tried,
                arch_list=arch_list, cpus=os.cpu_count(), commit=_commit())


def _commit() -> str:
    """The checkout's commit (and '+changes' where files differ from it), or 'unknown' outside a git checkout."""
    run = lambda *args: subprocess.run(['git', *args], cwd=ROOT, capture_output=True, text=True)
    try:
        head, status = run('rev-parse', '--short=12', 'HEAD'), run('status', '--porcelain', '--untracked-files=no')
    except OSError:  # No git.
        return 'unknown'
    if head.returncode != 0:
        return 'unknown'
    return head.stdout.strip() + ('+changes' if status.stdout.strip() else '')


def build_plugin(name: str, json_path: str) -> None:
    """Build one plugin into custom_ops' cache (run by build() in a subprocess); the outcome as JSON."""
    start = time.monotonic()
    try:
        module = custom_ops.get_plugin(**PLUGINS[name].plugin_args)
        outcome = dict(ok=True, library=module.__file__)
    except custom_ops.BuildError as err:
        outcome = dict(ok=False, cause=err.cause, details=err.details)
    with dnnlib.util.atomic_path(json_path) as tmp, open(tmp, 'w') as f:
        json.dump(dict(outcome, seconds=time.monotonic() - start), f)


def build(ctx: Context) -> dict:
    """Both plugins built at once, each in a subprocess (stopped at the box), then loaded here from the cache."""
    children = {}
    for name in PLUGINS:
        code = f'from bench import gpu_report; gpu_report.build_plugin({name!r}, {os.path.join(ctx.workdir, f"build-{name}.json")!r})'
        children[name] = Child([sys.executable, '-c', code], os.path.join(ctx.workdir, f'build-{name}.log'))
    try:
        returncodes = {name: child.wait(ctx.deadline) for name, child in children.items()}
    except BaseException:
        for child in children.values():
            child.stop(signal.SIGTERM, STOP_GRACE)
        raise
    results = {}
    for name, child in children.items():
        result = child.result(returncodes[name])
        json_path = os.path.join(ctx.workdir, f'build-{name}.json')
        if os.path.isfile(json_path):
            with open(json_path) as f:
                result.update(json.load(f))
        elif result['stopped_at_box']:
            result.update(ok=False, cause='stopped at the time box while building')
        else:
            result.update(ok=False, cause=f'the build process ended with status {result["returncode"]}')
        if result['ok']:
            start = time.monotonic()
            try:
                module = custom_ops.get_plugin(**PLUGINS[name].plugin_args)  # From the cache the build just filled.
                PLUGINS[name].module, PLUGINS[name].failed = module, False
            except custom_ops.BuildError as err:
                result.update(ok=False, cause=f'built, but loading it here failed: {err.cause}', details=err.details)
            result['load_seconds'] = time.monotonic() - start
        results[name] = result
    return dict(ok=all(r['ok'] for r in results.values()), stopped_at_box=any(r['stopped_at_box'] for r in results.values()),
                plugins=results)


def _measured_calls(ctx: Context, calls: List[dict], record: Callable[[dict], List[dict]]) -> dict:
    """Each call (a dict with 'call' and what record() needs) made in turn until the box ends; record(call) makes
    the call and returns the rows of what it measured."""
    rows: List[dict] = []
    for i, call in enumerate(calls):
        if time.monotonic() > ctx.deadline:
            return dict(ok=all(r['ok'] for r in rows), stopped_at_box=True, rows=rows,
                        note=f'stopped at its time box after {i} of {len(calls)} calls')
        rows += record(call)
    return dict(ok=all(r['ok'] for r in rows), stopped_at_box=False, rows=rows)


def self_check(ctx: Context, device: torch.device = torch.device('cuda')) -> dict:
    """Run the ops once per network configuration with fresh self-check state; collect what the checks measured."""
    for plugin in PLUGINS.values():
        plugin.verdicts, plugin.check_results = {}, {}
    filters = {name: upfirdn2d.setup_filter(taps, device=device)
               for name, taps in [('[1,2,1]', [1, 2, 1]), ('box', [1, 1]), ('[1,3,3,1]', [1, 3, 3, 1])]}
    calls = []
    for dtype in DTYPES:
        x = torch.randn([2, 8, 16, 16], device=device).to(dtype)
        for act in bias_act.activation_funcs:
            calls.append(dict(op=f'bias_act {act}', dtype=dtype, plugin=PLUGINS['bias_act'],
                              call=lambda x=x, act=act: bias_act.bias_act(x, torch.zeros([8], device=device), act=act)))
        resampling = [('filter2d [1,2,1]', lambda x=x: upfirdn2d.filter2d(x, filters['[1,2,1]']))]
        for fname, f in filters.items():
            resampling.append((f'upsample2d {fname}', lambda x=x, f=f: upfirdn2d.upsample2d(x, f)))
            resampling.append((f'downsample2d {fname}', lambda x=x, f=f: upfirdn2d.downsample2d(x, f)))
        calls += [dict(op=name, dtype=dtype, plugin=PLUGINS['upfirdn2d'], call=call) for name, call in resampling]

    def record(call: dict) -> List[dict]:
        results = call['plugin'].check_results
        before = set(results)
        call['call']()
        return [dict(op=call['op'], dtype=str(call['dtype']).replace('torch.', ''), **results[config],
                     ok=results[config]['cause'] is None) for config in set(results) - before]
    with mock.patch.dict(os.environ, {kernel_choice.SELF_CHECK_ENV: '1'}):
        return _measured_calls(ctx, calls, record)


def op_choices(ctx: Context) -> dict:
    """The chooser's decisions for what StyleGAN runs at each resolution: lrelu, blur, 2x up/down (box)."""
    for plugin in PLUGINS.values():
        plugin.choices = {}
    device = torch.device('cuda')
    blur, box = upfirdn2d.setup_filter([1, 2, 1], device=device), upfirdn2d.setup_filter([1, 1], device=device)
    ops = [('bias_act lrelu', PLUGINS['bias_act'], lambda x: bias_act.bias_act(x, None, act='lrelu')),
           ('filter2d [1,2,1]', PLUGINS['upfirdn2d'], lambda x: upfirdn2d.filter2d(x, blur)),
           ('upsample2d box', PLUGINS['upfirdn2d'], lambda x: upfirdn2d.upsample2d(x, box)),
           ('downsample2d box', PLUGINS['upfirdn2d'], lambda x: upfirdn2d.downsample2d(x, box))]
    calls = []
    for dtype in DTYPES:
        for resolution in (8, 32, 128, 512, 1024):
            shape = [4 if resolution >= 512 else 16, min(16384 // resolution, 512), resolution, resolution]
            for name, plugin, op in ops:
                calls.append(dict(op=name, dtype=dtype, plugin=plugin, shape=shape, call=lambda op=op, shape=shape,
                                  dtype=dtype: op(torch.randn(shape, device=device).to(dtype))))

    def record(call: dict) -> List[dict]:
        choices = call['plugin'].choices
        before = set(choices)
        call['call']()
        return [dict(op=call['op'], shape=str(call['shape']), dtype=str(call['dtype']).replace('torch.', ''),
                     kernel_ms=choices[key]['kernel_ms'], reference_ms=choices[key]['reference_ms'],
                     chosen='kernel' if choices[key]['kernel'] else 'reference', ok=True)
                for key in set(choices) - before]
    with mock.patch.dict(os.environ, {kernel_choice.AUTOTUNE_ENV: '1'}):
        return _measured_calls(ctx, calls, record)


def _test_workers() -> int:
    """pytest-xdist workers for a test step: one per core, at most 16 (1: xdist not installed, no workers)."""
    return min(os.cpu_count() or 1, 16) if importlib.util.find_spec('xdist') else 1


def _pytest(ctx: Context, name: str, args: Sequence[str] = (), env: Optional[Dict[str, str]] = None) -> dict:
    """python -m pytest with the GPU visible, one pytest-xdist worker per core (_test_workers), idle workers taking
    tests queued for others (--dist=worksteal) so that long tests do not hold up the end, until the box ends: then
    pytest gets SIGINT and reports the tests that finished. Its counts from the JUnit XML, each failure named."""
    xml_path = os.path.join(ctx.workdir, f'{name}.xml')
    workers = _test_workers()
    parallel = ['-n', str(workers), '--dist=worksteal'] if workers > 1 else []
    with mock.patch.dict(os.environ, env or {}):
        result = run_child([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', *parallel,
                            f'--junitxml={xml_path}', *args], os.path.join(ctx.workdir, f'{name}.log'),
                           ctx.deadline - time.monotonic(), **SUITE_STOP)
    if os.path.isfile(xml_path):
        result.update(suite_counts(xml_path))
    return result


def run_test_suite(ctx: Context) -> dict:
    """The whole suite with the GPU visible (tests marked gpu run; the others pin the CPU); rehearsed: rehearsal_tests of
    it, selected as the quick run selects its tests."""
    if ctx.rehearse:
        return _run_selected(ctx, 'tests', [t['id'] for t in collect_tests(ctx)], 'the whole suite')
    return _pytest(ctx, 'tests')


# The quick run's tests. First the tests marked gpu and the files that check the captured training steps and the
# kernels on the device (what only a GPU shows); then a sample of the rest, as large as its step's plan holds.
FIRST_TEST_FILES = ('tests/test_graphs.py', 'tests/test_training_step.py', 'tests/test_ops_gpu.py')
# The sample's cost model, from the first GPU run of the whole suite (one H200, 16 workers,
# 1,769 tests in 232 s): worker-seconds per test, and seconds for pytest's and its workers' start and collection.
TEST_WORKER_SECONDS = 232 * 16 / 1769
TEST_START_SECONDS = 15
SAMPLE_SEED = 0  # The sample is the same at every run: a failure seen once can be seen again.
# pytest plugin (-p bench.gpu_report, below): with COLLECT_ENV set, the collected tests are written to that JSON
# file; with SELECT_ENV set, only the tests whose node ids that JSON file lists run.
COLLECT_ENV = 'GPU_REPORT_COLLECT'
SELECT_ENV = 'GPU_REPORT_SELECT'


def pytest_collection_modifyitems(config, items) -> None:  # pylint: disable=unused-argument
    """pytest hook, when this module is a pytest plugin: only the selected tests (SELECT_ENV) run."""
    path = os.environ.get(SELECT_ENV)
    if path:
        with open(path) as f:
            wanted = set(json.load(f))
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in wanted])
        items[:] = [item for item in items if item.nodeid in wanted]


def pytest_collection_finish(session) -> None:
    """pytest hook, when this module is a pytest plugin: the collected tests' node ids and gpu marks (COLLECT_ENV)."""
    path = os.environ.get(COLLECT_ENV)
    if path:
        with dnnlib.util.atomic_path(path) as tmp, open(tmp, 'w') as f:
            json.dump([dict(id=item.nodeid, gpu=item.get_closest_marker('gpu') is not None)
                       for item in session.items], f)


def collect_tests(ctx: Context, paths: Sequence[str] = ()) -> List[dict]:
    """The tests of `paths` (none: the suite) as pytest collects them with the GPU visible (node id and gpu mark), in
    the suite's order; collected once per run (a subprocess, inside the running step's box)."""
    if ctx.tests is None:
        json_path = os.path.join(ctx.workdir, 'collected.json')
        with mock.patch.dict(os.environ, {COLLECT_ENV: json_path}):
            result = run_child([sys.executable, '-m', 'pytest', '--collect-only', '-q', '-p', 'no:cacheprovider',
                                '-p', 'bench.gpu_report', *paths], os.path.join(ctx.workdir, 'collect.log'),
                               ctx.deadline - time.monotonic())
        if not os.path.isfile(json_path):
            raise RuntimeError(f'pytest collected no tests ({_subprocess_line(result)})')
        with open(json_path) as f:
            ctx.tests = json.load(f)
    return ctx.tests


def planned_test_seconds(count: int, workers: int) -> float:
    """The seconds planned for `count` tests on `workers` workers: TEST_START_SECONDS + count * TEST_WORKER_SECONDS /
    workers."""
    return TEST_START_SECONDS + count * TEST_WORKER_SECONDS / workers


def quick_test_plan(tests: List[dict], workers: int, sample_seconds: float, seed: int = SAMPLE_SEED) -> dict:
    """The quick run's tests from the collected `tests`: 'first', every test marked gpu or in FIRST_TEST_FILES;
    'sample', as many of the others as planned_test_seconds fits into `sample_seconds` on `workers` workers, drawn
    one file at a time in turn (every file once before any file twice), at random within a file (`seed`); both in
    the suite's order. 'rest': how many tests the sample was drawn from."""
    first = [t['id'] for t in tests if t['gpu'] or t['id'].split('::')[0] in FIRST_TEST_FILES]
    chosen = set(first)
    by_file: Dict[str, List[str]] = {}
    for t in tests:
        if t['id'] not in chosen:
            by_file.setdefault(t['id'].split('::')[0], []).append(t['id'])
    rng = random.Random(seed)
    for ids in by_file.values():
        rng.shuffle(ids)
    size = max(int((sample_seconds - TEST_START_SECONDS) * workers / TEST_WORKER_SECONDS), 0)
    sampled: set = set()
    queues = [list(reversed(ids)) for ids in by_file.values()]
    while len(sampled) < size and any(queues):
        for queue in queues:
            if queue and len(sampled) < size:
                sampled.add(queue.pop())
    return dict(first=first, sample=[t['id'] for t in tests if t['id'] in sampled],
                rest=sum(len(ids) for ids in by_file.values()))


def rehearsal_tests(ids: List[str]) -> List[str]:
    """What a test step runs in the rehearsal: the first of `ids` of each file, from its first REHEARSAL_TESTS files."""
    firsts: Dict[str, str] = {}
    for i in ids:
        firsts.setdefault(i.split('::')[0], i)
    return list(firsts.values())[:REHEARSAL_TESTS]


def _run_selected(ctx: Context, name: str, ids: List[str], what: str) -> dict:
    """The tests `ids` through _pytest, selected by this module as a pytest plugin (node ids need no quoting); in the
    rehearsal, rehearsal_tests of them."""
    if ctx.rehearse:
        ids, what = rehearsal_tests(ids), f'rehearsed: the first test of a file each of {what}'
    json_path = os.path.join(ctx.workdir, f'{name}-selected.json')
    with open(json_path, 'w') as f:
        json.dump(ids, f)
    files = list(dict.fromkeys(i.split('::')[0] for i in ids))
    result = _pytest(ctx, name, ['-p', 'bench.gpu_report', *files], {SELECT_ENV: json_path})
    return dict(result, selected=what)


def run_first_tests(ctx: Context) -> dict:
    """The tests marked gpu and FIRST_TEST_FILES (quick_test_plan's 'first')."""
    plan = quick_test_plan(collect_tests(ctx), _test_workers(), 0)
    return _run_selected(ctx, 'tests-first', plan['first'], f'{len(plan["first"])} tests: those marked gpu and '
                         f'{", ".join(FIRST_TEST_FILES)}')


def run_test_sample(ctx: Context) -> dict:
    """quick_test_plan's sample of the rest of the suite, sized to this step's box."""
    workers = _test_workers()
    plan = quick_test_plan(collect_tests(ctx), workers, ctx.deadline - time.monotonic())
    return _run_selected(ctx, 'tests-sample', plan['sample'], f'a sample of {len(plan["sample"])} of the other '
                         f'{plan["rest"]} tests (seed {SAMPLE_SEED}; every file before any file twice), planned '
                         f'{planned_test_seconds(len(plan["sample"]), workers):.0f} s on {workers} workers')


def suite_counts(xml_path: str) -> dict:
    """Tests, failures, errors, skipped and passed in pytest's JUnit XML (also pytest-xdist's), each failure named."""
    root = ET.parse(xml_path).getroot()
    suites = [root] if root.tag == 'testsuite' else root.findall('testsuite')
    counts = {key: sum(int(suite.get(key, 0)) for suite in suites) for key in ('tests', 'failures', 'errors', 'skipped')}
    failed = []
    for case in root.iter('testcase'):
        for problem in list(case.findall('failure')) + list(case.findall('error')):
            failed.append(dict(test=f'{case.get("classname")}::{case.get("name")}',
                               message=(problem.get('message') or '')[:300]))
    return dict(counts, passed=counts['tests'] - counts['failures'] - counts['errors'] - counts['skipped'], failed=failed)


def digits_run(ctx: Context, device: str = 'cuda') -> dict:
    """DIGITS_COMMAND on `device` for what the box leaves after DIGITS_SCORING seconds (at most
    DIGITS_TRAINING_MAX), then stopped (snapshots are written whole or not at all); its last grid copied to
    outdir/digits-fakes.png, its last snapshot scored (score_digits) in the rest of the box. Rehearsed: on the CPU, a
    few steps of narrow networks (DIGITS_REHEARSAL), scored on a few images by a briefly trained judge."""
    runs = os.path.join(ctx.workdir, 'digits')
    training = max(min(ctx.deadline - time.monotonic() - DIGITS_SCORING, DIGITS_TRAINING_MAX[ctx.quick]), 0)
    device = 'cpu' if ctx.rehearse else device
    command = [sys.executable, *rehearsed(DIGITS_COMMAND, DIGITS_REHEARSAL, ctx), f'--outdir={runs}', f'--device={device}']
    train = run_child(command, os.path.join(ctx.workdir, 'digits-train.log'), training + STOP_GRACE)
    result = dict(train, training_box=training, returncode='stopped after the time box' if train['stopped_at_box']
                  else train['returncode'])
    snapshots = sorted(glob.glob(os.path.join(runs, '*', 'network-snapshot-*.pkl')))
    grids = sorted(glob.glob(os.path.join(runs, '*', 'fakes[0-9]*.png')))
    if grids:
        with dnnlib.util.atomic_path(os.path.join(ctx.outdir, 'digits-fakes.png')) as tmp:
            shutil.copyfile(grids[-1], tmp)
        result['grid'] = f'digits-fakes.png (from {os.path.basename(grids[-1])})'
    result['snapshot'] = os.path.basename(snapshots[-1]) if snapshots else None
    result['score'] = score_digits(ctx, snapshots[-1], device, SCORE_REHEARSAL if ctx.rehearse else ()) if snapshots else None
    result['ok'] = result['score'] is not None and result['score']['ok']
    result['stopped_at_box'] = result['score'] is not None and result['score']['stopped_at_box']
    return result


def digits_stylegan2_run(ctx: Context, device: str = 'cuda') -> dict:
    """SG2_DIGITS_COMPARE on `device` in the box: every run that ended with its final scores and time per kimg; the
    runs' final samples (compare.py's samples.png) copied to outdir/digits-stylegan2.png. Rehearsed: on the CPU, runs of
    a few steps of narrow networks (SG2_DIGITS_REHEARSAL), each scored on a few images."""
    out = os.path.join(ctx.workdir, 'compare-stylegan2')
    device, extra = ('cpu', SG2_DIGITS_REHEARSAL_EXTRA) if ctx.rehearse else (device, SG2_DIGITS_EXTRA)
    command = [sys.executable, *rehearsed(SG2_DIGITS_COMPARE, SG2_DIGITS_REHEARSAL, ctx), f'--out={out}',
               f'--extra={extra} --device={device}']
    result = run_child(command, os.path.join(ctx.workdir, 'digits-stylegan2.log'), ctx.deadline - time.monotonic())
    manifest_path = os.path.join(out, 'manifest.json')
    runs = json.load(open(manifest_path))['runs'] if os.path.isfile(manifest_path) else {}
    result['runs'] = [dict(run=key, **{k: v for k, v in run['snapshots'][-1].items() if k != 'path'},
                           sec_per_kimg=run['sec_per_kimg']) for key, run in runs.items() if run['snapshots']]
    if os.path.isfile(os.path.join(out, 'samples.png')):
        with dnnlib.util.atomic_path(os.path.join(ctx.outdir, 'digits-stylegan2.png')) as tmp:
            shutil.copyfile(os.path.join(out, 'samples.png'), tmp)
        result['samples'] = 'digits-stylegan2.png'
    return result


def score_digits(ctx: Context, snapshot: str, device: str, score_args: Sequence[str] = ()) -> dict:
    """bench/quickstart_quality.py on `snapshot` (on `device`, with `score_args`) for what is left of the box."""
    return _json_bench('bench.quickstart_quality', [f'--network={snapshot}', f'--device={device}', *score_args],
                       ctx.workdir, 'digits-quality', ctx.deadline - time.monotonic())


def bench_step(module: str, args: Dict[bool, List[str]], authors: bool = False,
               rehearsal: Optional[Dict[str, str]] = None) -> Callable[[Context], dict]:
    """A step that runs a bench program (`module`) writing --out=JSON, with args[quick] (and `authors`: the authors' code, when
    given, as --authors-code). Rehearsed: with the options of `rehearsal` in place of the same ones (the smallest sizes,
    the CPU); None: the program needs a CUDA GPU, and the rehearsal parses its command line with the program's own
    parser without running it."""
    def run(ctx: Context) -> dict:
        extra = [f'--authors-code={ctx.authors_code}'] if authors and ctx.authors_code else []
        if ctx.rehearse and rehearsal is None:
            return parse_only(module, args[ctx.quick] + extra)
        return _json_bench(module, rehearsed(args[ctx.quick], rehearsal or {}, ctx) + extra, ctx.workdir,
                           ctx.key.replace('_', '-'), ctx.deadline - time.monotonic())
    return run


def rehearsed(args: Sequence[str], rehearsal: Dict[str, str], ctx: Context) -> List[str]:
    """`args` as the rehearsal runs them (ctx.rehearse): each --name=value of `rehearsal` in place of the same option of
    `args`, or added; otherwise `args` as they are."""
    if not ctx.rehearse:
        return list(args)
    out, names = [], set()
    for arg in args:
        name = arg.split('=', 1)[0]
        out.append(f'{name}={rehearsal[name]}' if name in rehearsal else arg)
        names.add(name)
    return out + [f'{name}={value}' for name, value in rehearsal.items() if name not in names]


def parse_only(module: str, args: List[str]) -> dict:
    """The rehearsal of a bench program that needs a CUDA GPU: `args` read by the program's own command line parser
    (an option it does not know or a value it refuses fails the step), not run."""
    command = importlib.import_module(module).main
    try:
        command.make_context(module, list(args) + ['--out=rehearsal.json'])
    except click.ClickException as err:
        return dict(ok=False, stopped_at_box=False, last_line=err.format_message(),
                    note=f'{module} refused its command line `{" ".join(args)}`: {err.format_message()}')
    return dict(ok=True, stopped_at_box=False, note=f'{module} needs a CUDA GPU: its command line parsed, not run')


@dataclasses.dataclass
class Step:
    key: str
    title: str
    run: Callable[[Context], dict]  # -> its result: 'ok', 'stopped_at_box' and what it measured
    seconds: Dict[bool, Optional[float]]  # planned seconds by --quick; None: not part of that run
    needs: Sequence[str] = ()  # what must hold: 'cuda' (a CUDA build of torch), 'gpu', 'built' (both plugins)
    cuda_only: str = ''  # What of the step only CUDA does, which the rehearsal skips (all of it: needs 'cuda' or 'built').


# The rehearsal (--rehearse): the options that give each command its smallest size on a CPU.
REHEARSAL_BUDGET = {True: 1200, False: 6000}  # Seconds, by --quick: more than the plans; boxes only a hung step reaches.
REHEARSAL_TESTS = 3  # Tests a test step runs: the first of a file each (rehearsal_tests).
TRAIN_SPEED_REHEARSAL = {'--rounds': '1', '--warmup': '0', '--cuda-graphs': 'off', '--device': 'cpu'}
TRAIN_SPEED_CUDA = 'the CUDA-graph rows (--cuda-graphs=off here), the device time from CUDA events, the peak GPU memory'
SNGAN_REHEARSAL = dict(TRAIN_SPEED_REHEARSAL, **{'--batch': '2', '--ch': '2'})
STYLEGAN_REHEARSAL = dict(TRAIN_SPEED_REHEARSAL, **{'--resolution': '32', '--cmax': '4', '--batch': '4'})
DIGITS_REHEARSAL = {'--cmax': '4', '--map-dim': '16', '--batch': '4', '--lod-kimg': '0.008', '--kimg': '0.016',
                    '--tick': '0.004', '--snap': '1', '--workers': '0'}
SCORE_REHEARSAL = ('--num=20', '--epochs=1')  # The scoring of the digits: a few images, a judge trained for one epoch.
SG2_DIGITS_REHEARSAL = {'--kimg': '0.008', '--snaps': '1', '--num': '20'}
SG2_DIGITS_REHEARSAL_EXTRA = '--cmax=4 --map-dim=8 --batch=4 --workers=0'
TESTS_CUDA = 'the tests marked gpu (pytest skips them without a GPU)'


SNGAN_PRESETS = 'cifar10-cnn,cifar10-resnet,stl10-cnn,stl10-resnet,cifar10-biggan,celebahq128-resnet,celebahq256-resnet'
# In order of value, with their planned seconds: the module docstring's table.
STEPS = [
    Step('environment', 'Environment', environment, {True: 5, False: 5}),
    Step('build', 'Build (torch_utils/custom_ops.py)', build, {True: 60, False: 300}, ('cuda',),
         'the plugins\' build needs a CUDA build of torch and the CUDA toolkit'),
    Step('first_tests', 'Tests marked gpu and the CUDA-graph checks (python -m pytest, GPU visible)', run_first_tests,
         {True: 70, False: None}, ('gpu',), TESTS_CUDA),
    Step('self_check', 'Self-check (first use of each configuration)', self_check, {True: 10, False: 30},
         ('gpu', 'built'), 'the kernels\' self-check runs the built plugins on the GPU'),
    Step('choices', 'Kernel or reference (the chooser, first use of each shape)', op_choices, {True: 10, False: 60},
         ('gpu', 'built'), 'the chooser times the built plugins on the GPU'),
    Step('test_suite', 'Test suite (python -m pytest, GPU visible)', run_test_suite, {True: None, False: 900}, ('gpu',),
         TESTS_CUDA),
    Step('test_sample', 'A sample of the other tests (python -m pytest, GPU visible)', run_test_sample,
         {True: 50, False: None}, ('gpu',), TESTS_CUDA),
    Step('bench_ops', 'Ops (bench/ops.py)', bench_step('bench.ops', {
        True: ['--repeats=5', '--warmup=2', '--sizes=8,32'], False: []}), {True: 15, False: 300}, ('gpu',),
         'bench/ops.py times the CUDA kernels: its command line is parsed, not run'),
    Step('train_speed', 'Training speed, cifar10-resnet, CUDA graphs and eager (bench/train_speed.py)',
         bench_step('bench.train_speed', {
             True: ['--norms=gn,none', '--precisions=tf32,bf16', '--cuda-graphs=both', '--rounds=3'],
             False: ['--norms=gn,none', '--linear-d=both', '--fuse-d=both', '--precisions=fp32,tf32,bf16',
                     '--cuda-graphs=both']}, authors=True, rehearsal=SNGAN_REHEARSAL),
         {True: 30, False: 400}, ('gpu',), TRAIN_SPEED_CUDA),
    Step('train_speed_deterministic', 'Training speed, cifar10-resnet with --deterministic (bench/train_speed.py)',
         bench_step('bench.train_speed', {False: ['--norms=gn,none', '--precisions=tf32', '--deterministic']},
                    rehearsal=SNGAN_REHEARSAL),
         {True: None, False: 120}, ('gpu',), TRAIN_SPEED_CUDA),
    Step('train_speed_digits', 'Training speed, gn-stylegan on the digits at --cmax=32, batch 32, CUDA graphs and eager '
         '(bench/train_speed.py)', bench_step('bench.train_speed', {
             quick: ['--cfg=gn-stylegan', '--resolution=32', '--cmax=32', '--batch=32', '--norms=gn', '--precisions=tf32',
                     '--cuda-graphs=both', f'--rounds={3 if quick else 10}'] for quick in (True, False)},
                                                   rehearsal=STYLEGAN_REHEARSAL),
         {True: 15, False: 60}, ('gpu',), TRAIN_SPEED_CUDA),
    Step('precision', 'GN\'s D gradient against float64 at fp32, tf32 and bf16, both D-step forms: what docs/precision.md '
         'leaves open on a GPU (bench/precision.py)', bench_step('bench.precision', {
             quick: ['--cfg=cifar10-cnn,cifar10-resnet', '--batch=8', '--seeds=1', '--norms=gn,none',
                     '--precisions=fp32,tf32,bf16', '--linear-d=both', '--device=cuda'] for quick in (True, False)},
             rehearsal={'--cfg': 'cifar10-cnn', '--batch': '2', '--device': 'cpu'}),
         {True: 10, False: 60}, ('gpu',)),
    Step('train_speed_presets', 'Training speed of the paper\'s SN-GAN and BigGAN presets with GN, tf32 and bf16, as train.py '
         'runs them: the time column of docs/reproduce.md (bench/train_speed.py)', bench_step('bench.train_speed', {
             quick: [f'--cfg={SNGAN_PRESETS}', '--norms=gn', '--fast-g=default', '--precisions=tf32,bf16']
             + (['--rounds=1'] if quick else []) for quick in (True, False)},
             rehearsal=SNGAN_REHEARSAL),
         {True: 35, False: 300}, ('gpu',), TRAIN_SPEED_CUDA),
    Step('train_speed_aug', 'Training speed with augmentation: none, ADA\'s bgc pipeline and DiffAugment, for gn-stylegan2 at '
         '256x256 and cifar10-resnet, GN, tf32 (bench/train_speed.py)', bench_step('bench.train_speed', {
             False: ['--cfg=gn-stylegan2,cifar10-resnet', '--resolution=256', '--batch=16', '--norms=gn', '--precisions=tf32',
                     '--augs=noaug,ada,diffaug']}, rehearsal=dict(SNGAN_REHEARSAL, **{'--cfg': 'cifar10-resnet'})),
         {True: None, False: 60}, ('gpu',), TRAIN_SPEED_CUDA),
    Step('stylegan', 'GN-StyleGAN steps at 256x256 and 1024x1024, batch 4, kernels against reference ops '
         '(bench/stylegan.py)', bench_step('bench.stylegan', {
             quick: ['--resolutions=256,1024', '--max-resolution=1024', '--impl=both']
             + (['--steps=5', '--warmup=2'] if quick else []) for quick in (True, False)}),
         {True: 25, False: 300}, ('gpu',), 'bench/stylegan.py needs a CUDA GPU: its command line is parsed, not run'),
    Step('train_speed_stylegan', 'Training speed, gn-stylegan at 256x256 by precision (bench/train_speed.py)',
         bench_step('bench.train_speed', {False: ['--cfg=gn-stylegan', '--resolution=256', '--batch=16',
                                                     '--norms=gn,none', '--precisions=fp32,tf32,bf16,fp16']},
                    rehearsal=STYLEGAN_REHEARSAL),
         {True: None, False: 600}, ('gpu',), TRAIN_SPEED_CUDA),
    Step('train_speed_stylegan_1024', 'Training speed, gn-stylegan at 1024x1024, batch 4 (bench/train_speed.py)',
         bench_step('bench.train_speed', {False: ['--cfg=gn-stylegan', '--resolution=1024', '--batch=4',
                                                     '--norms=gn,none', '--precisions=tf32,bf16']},
                    rehearsal=STYLEGAN_REHEARSAL),
         {True: None, False: 300}, ('gpu',), TRAIN_SPEED_CUDA),
    Step('stylegan2', 'gn-stylegan2 iterations at 256x256 and 1024x1024, tf32/bf16/fp16, kernels against reference ops '
         '(bench/stylegan2.py)', bench_step('bench.stylegan2', {False: ['--resolutions=256,1024',
                                                                          '--precisions=tf32,bf16,fp16', '--impl=both']},
                                            rehearsal={'--resolutions': '32', '--cmax': '4', '--steps': '1',
                                                       '--warmup': '0', '--device': 'cpu'}),
         {True: None, False: 300}, ('gpu',), 'the CUDA kernels (impl cuda runs the reference ops), the peak GPU memory'),
    Step('digits', 'GN-StyleGAN on the embedded digits, time-boxed, scored (bench/quickstart_quality.py)', digits_run,
         {True: 25, False: 750}, ('gpu',)),
    Step('digits_stylegan2', 'gn-stylegan2 on the digits: GN, R1 and no constraint at equal kimg, docs/results.md\'s '
         'comparison on the GPU, time-boxed (bench/compare.py)', digits_stylegan2_run, {True: None, False: 420}, ('gpu',)),
]


def planned_steps(quick: bool) -> List[Step]:
    return [step for step in STEPS if step.seconds[quick] is not None]


# ----------------------------------------------------------------------------
# The run: steps in order, each in its box, the report written as each one starts and ends.


class Report:
    """report.json, report.md and logs.tar.gz in `outdir`, rewritten whole (atomically) whenever a step starts or
    ends, so that at any moment they hold everything finished."""

    def __init__(self, outdir: str, workdir: str, quick: bool, budget: float, steps: List[Step], start: float,
                 rehearse: bool = False) -> None:
        self.outdir, self.workdir, self.start = outdir, workdir, start
        self.data = dict(command='python -m bench.gpu_report' + (' --quick' if quick else '') + (' --rehearse' if rehearse
                         else ''), quick=quick, rehearsal=rehearse, budget_s=budget, seconds=0.0, stopped=None,
                         steps=[dict(key=s.key, title=s.title, planned_s=s.seconds[quick], status='not run',
                                     why='not reached yet', box_s=None, seconds=None, result=None,
                                     **(dict(cuda_only=s.cuda_only) if rehearse else {})) for s in steps])

    def step(self, key: str) -> dict:
        return next(entry for entry in self.data['steps'] if entry['key'] == key)

    def result(self, key: str) -> Optional[dict]:
        return self.step(key)['result']

    def write(self) -> None:
        self.data['seconds'] = time.monotonic() - self.start
        self.data['targets'] = targets(self.data)
        logs = sorted(glob.glob(os.path.join(self.workdir, '*.log')))
        if logs:
            with dnnlib.util.atomic_path(os.path.join(self.outdir, 'logs.tar.gz')) as tmp, tarfile.open(tmp, 'w:gz') as tar:
                for log in logs:
                    tar.add(log, arcname=os.path.basename(log))
        for name, text in (('report.json', json.dumps(self.data, indent=2, default=str) + '\n'),
                           ('report.md', markdown(self.data))):
            with dnnlib.util.atomic_path(os.path.join(self.outdir, name)) as tmp, open(tmp, 'w') as f:
                f.write(text)


def _why_not(step: Step, report: Report, gpu: bool) -> Optional[str]:
    """Why `step` cannot run here, or None (`report` None: only what is known before any step runs)."""
    if 'cuda' in step.needs and torch.version.cuda is None:
        return f'this torch ({torch.__version__}) has no CUDA support'
    if 'gpu' in step.needs and not gpu:
        return 'no GPU'
    if 'built' in step.needs and report is not None and not (report.result('build') or {}).get('ok'):
        return 'the plugins did not build'
    return None


def run_steps(report: Report, steps: List[Step], ctx: Context) -> None:
    """Each step in order, in its box; the report written as each starts and ends. A step that raises ends the
    run (the rest not run, because it crashed); Stopped (a signal) propagates once the report says so."""
    gpu = _has_gpu() or ctx.rehearse  # The rehearsal runs the GPU's steps on the CPU.
    running = None  # (step, its entry, its start) while a step runs
    try:
        for i, step in enumerate(steps):
            entry = report.step(step.key)
            if ctx.rehearse and {'cuda', 'built'} & set(step.needs):
                entry.update(status='skipped', why=f'CUDA only: {step.cuda_only}')
                continue
            why = _why_not(step, report, gpu)
            left = report.start + report.data['budget_s'] - REPORT_RESERVE - time.monotonic()
            later = sum(s.seconds[ctx.quick] for s in steps[i + 1:] if _why_not(s, None, gpu) is None)
            box = min(left, max(step.seconds[ctx.quick], left - later))
            if why is None and box < step.seconds[ctx.quick] / 2:
                why = f'budget spent ({max(left, 0):.0f} s of the {report.data["budget_s"]:.0f} s left, planned ' \
                      f'{step.seconds[ctx.quick]:.0f} s)'
            if why is not None:
                entry.update(why=why)
                continue
            click.echo(f'[{time.monotonic() - report.start:4.0f} s] {step.title}: box {box:.0f} s...')
            running = step, entry, time.monotonic()
            entry.update(status='running', why=None, box_s=round(box, 1))
            report.write()
            ctx.key, ctx.deadline = step.key, running[2] + box
            try:
                result = step.run(ctx)
            except Exception as err:  # pylint: disable=broad-except  # a bug here must not lose the report
                with open(os.path.join(ctx.workdir, f'crash-{step.key}.log'), 'w') as f:
                    f.write(traceback.format_exc())
                entry.update(status='crashed', seconds=time.monotonic() - running[2], why=f'{type(err).__name__}: '
                             f'{dnnlib.util.first_line(err, 300)} (logs.tar.gz: crash-{step.key}.log)')
                _not_reached(report, f'"{step.title}" crashed')
                report.data['stopped'] = f'{step.title} crashed'
                report.write()
                return
            status = 'stopped at its time box' if result.get('stopped_at_box') else 'ok' if result.get('ok') else 'failed'
            entry.update(status=status, seconds=time.monotonic() - running[2], result=result)
            running = None
            report.write()
            last = f': {result["last_line"]}' if result.get('last_line') else ''
            click.echo(f'[{time.monotonic() - report.start:4.0f} s] {step.title}: {status} in {entry["seconds"]:.0f} s{last}')
    except Stopped as stop:
        if running is not None:
            step, entry, start = running
            entry.update(status=f'stopped by {stop}', seconds=time.monotonic() - start)
        _not_reached(report, f'stopped by {stop}' + (f' during "{running[0].title}"' if running else ''))
        report.data['stopped'] = str(stop)
        report.write()
        raise
    report.write()


def _not_reached(report: Report, why: str) -> None:
    for entry in report.data['steps']:
        if entry['why'] == 'not reached yet':
            entry['why'] = why


# ----------------------------------------------------------------------------
# Markdown.

def _table(rows: List[dict], columns: List[str]) -> List[str]:
    def cell(value):
        if isinstance(value, float):
            return f'{value:.3g}'
        return 'x'.join(map(str, value)) if isinstance(value, list) else str(value)
    lines = ['| ' + ' | '.join(columns) + ' |', '|' + '---|' * len(columns)]
    lines += ['| ' + ' | '.join(cell(row.get(c, '')) for c in columns) + ' |' for row in rows]
    return lines


def _subprocess_line(result: dict) -> str:
    status = 'stopped at its time box' if result['stopped_at_box'] else f'exit status {result["returncode"]}'
    return f'`{result["command"]}`: {status}, {result["seconds"]:.0f} s (log: {result["log"]})'


def _build_lines(result: dict) -> List[str]:
    lines = []
    for name, plugin in result['plugins'].items():
        if plugin['ok']:
            lines.append(f'- {name}: built in {plugin["seconds"]:.1f} s in a subprocess beside the other, loaded here in '
                         f'{plugin["load_seconds"]:.1f} s ({plugin["library"]})')
        else:
            lines.append(f'- {name}: **FAILED** after {plugin["seconds"]:.1f} s: {plugin["cause"]} '
                         f'(log: {plugin["log"]})')
            lines += [f'    - `{line}`' for line in plugin.get('details', [])]
    return lines


def _self_check_lines(result: dict) -> List[str]:
    rows = result['rows']
    return _table(rows, ['op', 'dtype', 'error', 'tolerance', 'where', 'ms', 'ok', 'cause']) + [
        '', f'{len(rows)} checks, {sum(r["ms"] for r in rows):.0f} ms in all; error is the largest |CUDA - float64 '
            'reference| / (|reference| + rms(reference)) per element, over value, 1st and 2nd order gradients.']


def _choices_lines(result: dict) -> List[str]:
    return _table(result['rows'], ['op', 'shape', 'dtype', 'kernel_ms', 'reference_ms', 'chosen'])


def _suite_lines(result: dict) -> List[str]:
    lines = [_subprocess_line(result)] + ([f'Selected: {result["selected"]}.'] if 'selected' in result else [])
    if 'tests' in result:
        lines.append(f'{result["passed"]} passed, {result["failures"]} failed, {result["errors"]} errors, '
                     f'{result["skipped"]} skipped' + (' (the tests that finished before the box)'
                                                       if result['stopped_at_box'] else ''))
        lines += [f'- FAILED {f["test"]}: {f["message"]}' for f in result['failed']]
    return lines


def _ops_lines(result: dict) -> List[str]:
    lines = [_subprocess_line(result)] if 'command' in result else []  # None: parsed only (the rehearsal).
    data = result.get('data')
    if data:
        lines += [''] + _table(data['results'], ['op', 'shape', 'dtype', 'pass_name', 'ref_ms', 'cuda_ms', 'speedup',
                                                 'ref_GBps', 'cuda_GBps'])
        bad = [c for c in data['checks'] if not c['ok']]
        lines += ['', f'CUDA against the float64 reference before timing: {len(data["checks"]) - len(bad)} of '
                      f'{len(data["checks"])} cases within tolerance.']
        lines += [f'- FAIL {c["op"]} {c["shape"]} {c["dtype"]}: {c["where"]} off by {c["max_relative_error"]:.2g}'
                  for c in bad]
    return lines


def _bench_lines(result: dict) -> List[str]:
    lines = [_subprocess_line(result)] if 'command' in result else []
    rows = (result.get('data') or {}).get('results')
    if rows:
        lines += [''] + _table(rows, list(dict.fromkeys(k for r in rows for k in r)))
    return lines


def _digits_lines(result: dict) -> List[str]:
    lines = [_subprocess_line(result) + f'; training stopped after {result["training_box"]:.0f} s'
             if result['returncode'] == 'stopped after the time box' else _subprocess_line(result),
             f'Last snapshot: {result["snapshot"] or "none"}; grid: {result.get("grid", "none")}.']
    score = result['score']
    if score is not None:
        lines += ['', 'Scored: ' + _subprocess_line(score)]
        rows = (score.get('data') or {}).get('rows')
        if rows:
            lines += [''] + _table(rows, ['name', 'num', 'confident', 'classes', 'as_asked', 'fd'])
    return lines


def _digits_stylegan2_lines(result: dict) -> List[str]:
    lines = [_subprocess_line(result), f'Samples of the final snapshots: {result.get("samples", "none")}.']
    if result['runs']:
        lines += [''] + _table(result['runs'], ['run', 'kimg', 'confident', 'classes', 'as_asked', 'fd', 'sec_per_kimg'])
    return lines


def targets(data: dict) -> List[dict]:
    """The training step's targets (module docstring), each with the value the report measured (None: not measured)
    and whether it is met."""
    measured = {entry['key']: ((entry['result'] or {}).get('data') or {}) for entry in data['steps']}
    speed = measured.get('train_speed', {})
    rows = []

    def target(what: str, bound: str, value: Optional[float], met: Callable[[float], bool]) -> None:
        rows.append(dict(target=what, bound=bound, measured=value, met=None if value is None else met(value)))
    for norm, label, bound in (('gn', 'GN', 0.45), ('none', 'no constraint', 0.5)):
        row = next((r for r in speed.get('ours_over_authors', []) if (r['cfg'], r['norm'], r['precision'], r['cuda_graphs'])
                    == ('cifar10-resnet', norm, 'tf32', 'on')), None)
        target(f'cifar10-resnet iteration, {label}, CUDA graphs, tf32: ours / the authors\' code', f'<= {bound}',
               None if row is None else row['iteration'], lambda v, bound=bound: v <= bound)
    row = next((r for r in speed.get('gn_over_vanilla', []) if (r['cfg'], r['precision'], r['cuda_graphs'])
                == ('cifar10-resnet', 'tf32', 'on')), None)
    target('cifar10-resnet iteration, CUDA graphs, tf32: GN / no constraint', '<= 1.4',
           None if row is None else row['iteration'], lambda v: v <= 1.4)
    presets = measured.get('train_speed_presets', {}).get('results', [])
    for cfg in SNGAN_PRESETS.split(','):
        by_precision = {r['precision']: r['sec_per_iteration'] for r in presets if r['cfg'] == cfg}
        ratio = by_precision['bf16'] / by_precision['tf32'] if {'bf16', 'tf32'} <= set(by_precision) else None
        target(f'{cfg} iteration: bf16 / tf32', '< 1', ratio, lambda v: v < 1)
    row = next((r for r in measured.get('train_speed_digits', {}).get('results', []) if r['cuda_graphs'] == 'on'), None)
    target('gn-stylegan --cmax=32 digits step (D + G, batch 32), CUDA graphs, tf32, seconds', '<= 0.020',
           None if row is None else row['sec_per_iteration'], lambda v: v <= 0.020)
    return rows


def _target_lines(data: dict) -> List[str]:
    rows = [dict(row, measured='not measured' if row['measured'] is None else row['measured'],
                 met='' if row['met'] is None else 'yes' if row['met'] else '**no**') for row in targets(data)]
    return ['', '### Targets of the training step', ''] + _table(rows, ['target', 'bound', 'measured', 'met'])


RENDER = dict(build=_build_lines, self_check=_self_check_lines, choices=_choices_lines, test_suite=_suite_lines,
              first_tests=_suite_lines, test_sample=_suite_lines,
              bench_ops=_ops_lines, digits=_digits_lines, digits_stylegan2=_digits_stylegan2_lines)


def _status_line(entry: dict) -> str:
    if entry['status'] == 'not run':
        return f'Not run: {entry["why"]}.'
    if entry['status'] == 'skipped':
        return f'Skipped in the rehearsal: {entry["why"]}.'
    if entry['status'] == 'running':
        return f'Running when this report was written (box {entry["box_s"]:.0f} s).'
    took = '' if entry['seconds'] is None else f' after {entry["seconds"]:.0f} s'
    why = f': {entry["why"]}' if entry.get('why') else ''
    return f'**{entry["status"].capitalize()}**{took} (box {entry["box_s"]:.0f} s){why}.'


def markdown(data: dict) -> str:
    env = next((e['result'] for e in data['steps'] if e['key'] == 'environment'), None)
    title = 'The GPU check rehearsed on the CPU' if data.get('rehearsal') else 'GPU report'
    lines = [f'## {title}, {env["date"] if env else "environment not recorded"}', '']
    if env:
        gpus = ', '.join(f'{g["name"]} (sm {g["capability"]}, {g["memory_gib"]} GiB)' for g in env['gpus']) or 'no GPU'
        lines += [f'- Device: {gpus}; {env["cpus"]} CPU cores',
                  f'- torch {env["torch"]} (CUDA {env["torch_cuda"]}), Python {env["python"]}, {env["platform"]}',
                  f'- CUDA toolkit found by custom_ops: {env["cuda_home"]}; TORCH_CUDA_ARCH_LIST {env["arch_list"]}',
                  f'- Commit: {env.get("commit", "not recorded")}']
    ended = f'stopped: {data["stopped"]}' if data['stopped'] else 'in all'
    lines += [f'- Command: `{data["command"]}`, budget {data["budget_s"]:.0f} s; {data["seconds"]:.0f} s {ended}', '',
              '| step | planned s | box s | took s | status |', '|---|---|---|---|---|']
    for entry in data['steps']:
        box = '' if entry['box_s'] is None else f'{entry["box_s"]:.0f}'
        took = '' if entry['seconds'] is None else f'{entry["seconds"]:.0f}'
        status = entry['status'] + (f': {entry["why"]}' if entry['status'] in ('not run', 'skipped') else '')
        lines.append(f'| {entry["title"]} | {entry["planned_s"]:.0f} | {box} | {took} | {status} |')
    for entry in data['steps']:
        if entry['key'] == 'environment':
            continue
        lines += ['', f'### {entry["title"]}', '', _status_line(entry)]
        if entry['result'] is not None:
            lines += [''] + RENDER.get(entry['key'], _bench_lines)(entry['result'])
            if entry['result'].get('note'):
                lines += ['', entry['result']['note'] + '.']
            if entry.get('cuda_only'):
                lines += ['', f'Not rehearsed (CUDA only): {entry["cuda_only"]}.']
    lines += ([] if data.get('rehearsal') else _target_lines(data)) + _verified_lines(data)  # A CPU meets no target.
    return '\n'.join(lines) + '\n'


def graphs_verified_entry(data: dict) -> Optional[str]:
    """The line to add to torch_utils/compat.py's CUDA_GRAPHS_VERIFIED where this run's CUDA-graph tests passed on a GPU:
    the step that ran tests/test_graphs.py and tests/test_training_step.py with the GPU visible (--quick: the first
    tests; the full run: the whole suite) ended ok, with tests run and none failed; None otherwise (and in a
    rehearsal)."""
    env = next((e['result'] for e in data['steps'] if e['key'] == 'environment'), None)
    tests = next((e for e in data['steps'] if e['key'] in ('first_tests', 'test_suite')), None)
    if data.get('rehearsal') or not env or not env['gpus'] or tests is None or tests['status'] != 'ok':
        return None
    counts = tests['result']
    if not counts.get('tests') or counts.get('failures') or counts.get('errors'):
        return None
    gpu = env['gpus'][0]
    return (f"    {compat.release(env['torch'])}: '{gpu['name']} (sm {gpu['capability']}), torch {env['torch']}, "
            f"{env['date'][:10]}, commit {env.get('commit', 'unknown')}',")


def _verified_lines(data: dict) -> List[str]:
    if data.get('rehearsal'):
        return []
    entry = graphs_verified_entry(data)
    lines = ['', '### CUDA graphs on this torch', '']
    if entry is None:
        return lines + ['The CUDA-graph tests did not pass here (or did not run): --cuda-graphs=auto stays eager on this '
                        'torch release.']
    return lines + ['The CUDA-graph tests passed on this GPU. The line to add to `CUDA_GRAPHS_VERIFIED` in '
                    'torch_utils/compat.py, so that --cuda-graphs=auto captures on this torch release:', '',
                    entry]


# ----------------------------------------------------------------------------


@contextlib.contextmanager
def _signals_stop() -> Iterator[None]:
    """SIGTERM and SIGINT raise Stopped (once; later ones are ignored while the report is written), in the main
    thread; the previous handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signums = (signal.SIGTERM, signal.SIGINT)

    def handler(signum, _frame):
        for s in signums:
            signal.signal(s, signal.SIG_IGN)
        raise Stopped(signum)
    previous = {s: signal.signal(s, handler) for s in signums}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@click.command()
@click.option('--outdir', default='gpu-report', show_default=True, type=click.Path(file_okay=False),
              help='Where report.md, report.json, logs.tar.gz, digits-fakes.png and digits-stylegan2.png go.')
@click.option('--quick', is_flag=True, help='The check sized for a GPU lent for 15 minutes: fewer '
              'repeats and configurations, the tests marked gpu and a sample of the others, a short digits run; planned at most '
              '360 s on one H100/H200.')
@click.option('--budget', type=click.FloatRange(min=1), metavar='SECONDS',
              help='Most seconds for the whole run, from its start; steps that no longer fit are not started, a '
              'running step is stopped at its time box  [default: the sum of the planned steps: 360 with --quick, '
              f'{sum(s.seconds[False] or 0 for s in STEPS):.0f} without]')
@click.option('--authors-code', type=click.Path(exists=True, file_okay=False), metavar='DIR',
              help='A checkout of the GN-GAN authors\' code (github.com/basiclab/GNGAN-PyTorch): their cifar10-resnet '
              'steps timed beside ours, for the targets against it (bench/authors.py)')
@click.option('--rehearse', is_flag=True, help='Every step of the plan (with --quick: the quick one) on this CPU at the '
              'smallest size its command takes, the CUDA-only parts named as skipped: what a GPU would meet before '
              f'any timing  [default budget: {REHEARSAL_BUDGET[True]} s with --quick, {REHEARSAL_BUDGET[False]} without]')
def main(outdir: str, quick: bool, budget: Optional[float], authors_code: Optional[str], rehearse: bool) -> None:
    """Build, self-check, test and benchmark on this GPU within a time budget; a Markdown + JSON report, written
    as each step ends."""
    if os.path.exists(outdir) and not os.path.isdir(outdir):
        raise click.ClickException(f'--outdir: {outdir} exists and is not a directory')
    steps = planned_steps(quick)
    if budget is None:
        budget = REHEARSAL_BUDGET[quick] if rehearse else sum(step.seconds[quick] for step in steps)
    os.makedirs(outdir, exist_ok=True)
    for name in OUTPUTS:  # An earlier run's: none of them may pass for this run's.
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(outdir, name))
    workdir = tempfile.mkdtemp(prefix='gpu-report-')
    report = Report(outdir, workdir, quick, budget, steps, process_start(), rehearse)
    ctx = Context(workdir=workdir, outdir=outdir, quick=quick, rehearse=rehearse,
                  authors_code=None if authors_code is None else os.path.abspath(authors_code))
    try:
        with _signals_stop():
            try:
                run_steps(report, steps, ctx)
            except Stopped as stop:
                click.echo(f'Error: stopped by {stop}; {os.path.join(outdir, "report.md")} holds the steps that '
                           'finished', err=True)
                sys.exit(128 + stop.signum)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    click.echo(markdown(report.data))
    click.echo(f'Wrote {", ".join(sorted(os.listdir(outdir)))} to {outdir} in {report.data["seconds"]:.0f} s')
    failed = [e['title'] for e in report.data['steps'] if e['status'] in ('failed', 'crashed', 'stopped at its time box')]
    if failed:
        click.echo(f'Failed: {"; ".join(failed)}', err=True)
        sys.exit(1)


if __name__ == '__main__':
    main()  # pylint: disable=no-value-for-parameter
