"""One command for whoever has a GPU: build, self-check, the whole test suite, op and training benchmarks, and a
time-boxed GN-StyleGAN run on the embedded digits, scored; one report.

    python bench/gpu_report.py --quick                  # about nine minutes on one H100/H200
    python bench/gpu_report.py --outdir=h100-report     # more repeats, configurations and training time

Steps, each recorded in the report:
  1. environment   torch and CUDA versions, the GPUs, the CUDA toolkit that custom_ops finds and
                   the architectures it would build for;
  2. build         both plugins through torch_utils/custom_ops.py, timed (a fresh build needs an
                   empty TORCH_EXTENSIONS_DIR; otherwise this is the time to load the cached one);
  3. self-check    the kernels' first-use self-check, run for the configurations the networks use
                   (every activation of bias_act; the [1,2,1], box and [1,3,3,1] resampling of
                   upfirdn2d) in float32, float16 and bfloat16: measured error against the float64
                   reference (per element, see kernel_choice), tolerance, milliseconds, cause of a failure;
  4. choices       the chooser's decision, kernel or reference, with both timings, for the activation
                   and resampling StyleGAN runs at 8x8 ... 1024x1024 with its channel counts, in each dtype;
  5. test suite    python -m pytest on the whole suite with the GPU visible (in parallel when
                   pytest-xdist is installed): counts, failures by name, wall time;
  6. op benchmark  bench/ops.py (kernels against references, each case checked before timing);
  7. training      bench/train_speed.py: cifar10-resnet (GN and no constraint; affine/plain D step,
                   one or two D calls, precisions; the --deterministic switch's cost), every SN-GAN and
                   BigGAN preset with GN at tf32 (docs/reproduce.md's GPU time), gn-stylegan at
                   256x256 and at the paper's 1024x1024 with v1's per-GPU batch, each with its peak GPU memory;
  8. digits        train.py's GN-StyleGAN command for the embedded digits at full width, stopped after a
                   fixed time (--quick: 90 s), its last snapshot scored by bench/quickstart_quality.py
                   on the GPU, and its last image grid.
Without a GPU the report says "no GPU" for 3-8 and still records 1 and 2 (with a CUDA build of
torch, 2 is the real build). --outdir receives report.md (meant for docs/benchmarks.md),
report.json (the same data), logs.tar.gz (every step's log) and digits-fakes.png. Exit status 1
if anything that ran failed.
"""

import datetime
import glob
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from typing import List, Optional

import click
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import dnnlib  # noqa: E402  pylint: disable=wrong-import-position
from ops import bias_act, upfirdn2d  # noqa: E402  pylint: disable=wrong-import-position
from torch_utils import custom_ops, kernel_choice  # noqa: E402  pylint: disable=wrong-import-position

PLUGINS = {'bias_act': bias_act._plugin, 'upfirdn2d': upfirdn2d._plugin}  # pylint: disable=protected-access
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# bench/train_speed.py runs: (report key, title, arguments, arguments added by --quick). The choices a GPU decides for
# the SN-GAN presets: affine vs plain GN D step, one or two D calls, fp32 / TF32 / bf16, and what --deterministic costs;
# for GN-StyleGAN, the precisions at 256x256 and the paper's 1024x1024 at v1's per-GPU batch (32 on 8 GPUs: 4 each).
TRAINING_RUNS = [
    ('train_speed', 'Training speed, cifar10-resnet (bench/train_speed.py)',
     ['--norms=gn,none', '--linear-d=both', '--fuse-d=both', '--precisions=fp32,tf32,bf16'], ['--rounds=3']),
    ('train_speed_deterministic', 'Training speed, cifar10-resnet with --deterministic (bench/train_speed.py)',
     ['--norms=gn,none', '--precisions=tf32', '--deterministic'], ['--rounds=3']),
    ('train_speed_presets', 'Training speed of the paper\'s SN-GAN and BigGAN presets with GN, tf32: the time column of '
     'docs/reproduce.md (bench/train_speed.py)',
     ['--cfg=cifar10-cnn,cifar10-resnet,stl10-cnn,stl10-resnet,cifar10-biggan,celebahq128-resnet,celebahq256-resnet',
      '--norms=gn', '--fast-g=default', '--precisions=tf32'], ['--rounds=2']),
    ('train_speed_stylegan', 'Training speed, gn-stylegan at 256x256 (bench/train_speed.py)',
     ['--cfg=gn-stylegan', '--resolution=256', '--batch=16', '--norms=gn,none', '--precisions=fp32,tf32,bf16,fp16'],
     ['--rounds=2', '--precisions=tf32,bf16']),
    ('train_speed_stylegan_1024', 'Training speed, gn-stylegan at 1024x1024, batch 4 (bench/train_speed.py)',
     ['--cfg=gn-stylegan', '--resolution=1024', '--batch=4', '--norms=gn,none', '--precisions=tf32,bf16'],
     ['--rounds=2', '--norms=gn']),
]
# The digits at full width on a GPU: README's GN-StyleGAN digits command without the CPU's --cmax/--batch.
DIGITS_COMMAND = ['train.py', '--cfg=gn-stylegan', '--data=data/digits32.zip', '--lod-kimg=8', '--kimg=160', '--xflip=0',
                  '--tanh=1', '--tick=4', '--snap=2']
DIGITS_SECONDS = {True: 90, False: 600}  # Training time of the digits run, by --quick.


def _has_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def environment() -> dict:
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
    return dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
                platform=platform.platform(), python=platform.python_version(), torch=torch.__version__,
                torch_cuda=torch.version.cuda, gpus=gpus, cuda_home=cuda_home, cuda_home_rejected=tried,
                arch_list=arch_list)


def build() -> dict:
    results = {}
    for name, plugin in PLUGINS.items():
        start = time.perf_counter()
        try:
            module = custom_ops.get_plugin(**plugin.plugin_args)
        except custom_ops.BuildError as err:
            results[name] = dict(ok=False, seconds=time.perf_counter() - start, cause=err.cause, details=err.details)
            continue
        plugin.module, plugin.failed = module, False
        results[name] = dict(ok=True, seconds=time.perf_counter() - start, library=module.__file__)
    return results


def self_check() -> List[dict]:
    """Run the ops once per network configuration with fresh self-check state; collect what the checks measured."""
    os.environ[kernel_choice.SELF_CHECK_ENV] = '1'
    for plugin in PLUGINS.values():
        plugin.verdicts, plugin.check_results = {}, {}
    device = torch.device('cuda')
    filters = {name: upfirdn2d.setup_filter(taps, device=device)
               for name, taps in [('[1,2,1]', [1, 2, 1]), ('box', [1, 1]), ('[1,3,3,1]', [1, 3, 3, 1])]}
    calls = []  # (name, dtype, plugin, call)
    for dtype in DTYPES:
        x = torch.randn([2, 8, 16, 16], device=device).to(dtype)
        for act in bias_act.activation_funcs:
            calls.append((f'bias_act {act}', dtype, PLUGINS['bias_act'], lambda x=x, act=act: bias_act.bias_act(
                x, torch.zeros([8], device=device), act=act)))
        resampling = [('filter2d [1,2,1]', lambda x=x: upfirdn2d.filter2d(x, filters['[1,2,1]']))]
        for fname, f in filters.items():
            resampling.append((f'upsample2d {fname}', lambda x=x, f=f: upfirdn2d.upsample2d(x, f)))
            resampling.append((f'downsample2d {fname}', lambda x=x, f=f: upfirdn2d.downsample2d(x, f)))
        calls += [(name, dtype, PLUGINS['upfirdn2d'], call) for name, call in resampling]
    rows = []
    for name, dtype, plugin, call in calls:
        before = set(plugin.check_results)
        call()
        for config in set(plugin.check_results) - before:
            result = plugin.check_results[config]
            rows.append(dict(op=name, dtype=str(dtype).replace('torch.', ''), **result, ok=result['cause'] is None))
    return rows


def op_choices() -> List[dict]:
    """The chooser's decisions for what StyleGAN runs at each resolution: lrelu, blur, 2x up/down (box)."""
    os.environ[kernel_choice.AUTOTUNE_ENV] = '1'
    for plugin in PLUGINS.values():
        plugin.choices = {}
    device = torch.device('cuda')
    blur, box = upfirdn2d.setup_filter([1, 2, 1], device=device), upfirdn2d.setup_filter([1, 1], device=device)
    ops = [('bias_act lrelu', PLUGINS['bias_act'], lambda x: bias_act.bias_act(x, None, act='lrelu')),
           ('filter2d [1,2,1]', PLUGINS['upfirdn2d'], lambda x: upfirdn2d.filter2d(x, blur)),
           ('upsample2d box', PLUGINS['upfirdn2d'], lambda x: upfirdn2d.upsample2d(x, box)),
           ('downsample2d box', PLUGINS['upfirdn2d'], lambda x: upfirdn2d.downsample2d(x, box))]
    rows = []
    for dtype in DTYPES:
        for resolution in (8, 32, 128, 512, 1024):
            shape = [4 if resolution >= 512 else 16, min(16384 // resolution, 512), resolution, resolution]
            x = torch.randn(shape, device=device).to(dtype)
            for name, plugin, call in ops:
                before = set(plugin.choices)
                call(x)
                for key in set(plugin.choices) - before:
                    choice = plugin.choices[key]
                    rows.append(dict(op=name, shape=str(shape), dtype=str(dtype).replace('torch.', ''),
                                     kernel_ms=choice['kernel_ms'], reference_ms=choice['reference_ms'],
                                     chosen='kernel' if choice['kernel'] else 'reference'))
    return rows


def _run(command: List[str], log_path: str, timeout: int) -> dict:
    """Run a subprocess from the repository root, its output into log_path; returns status and seconds."""
    start = time.perf_counter()
    with open(log_path, 'w') as log:
        try:
            rc = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 'timeout'
    return dict(command=' '.join(command[1:]), returncode=rc, seconds=time.perf_counter() - start,
                log=f'logs.tar.gz: {os.path.basename(log_path)}')


def run_test_suite(workdir: str, timeout: int) -> dict:
    """The whole suite with the GPU visible (tests marked gpu run; the others pin the CPU), in parallel where
    pytest-xdist is installed."""
    xml_path = os.path.join(workdir, 'tests.xml')
    parallel = ['-n', str(min(os.cpu_count() or 1, 16))] if importlib.util.find_spec('xdist') else []
    result = _run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', *parallel, f'--junitxml={xml_path}'],
                  os.path.join(workdir, 'tests.log'), timeout)
    if os.path.isfile(xml_path):
        root = ET.parse(xml_path).getroot()
        suites = [root] if root.tag == 'testsuite' else root.findall('testsuite')
        counts = {key: sum(int(suite.get(key, 0)) for suite in suites) for key in ('tests', 'failures', 'errors', 'skipped')}
        failed = []
        for case in root.iter('testcase'):
            for problem in list(case.findall('failure')) + list(case.findall('error')):
                failed.append(dict(test=f'{case.get("classname")}::{case.get("name")}',
                                   message=(problem.get('message') or '')[:300]))
        result.update(counts, passed=counts['tests'] - counts['failures'] - counts['errors'] - counts['skipped'],
                      failed=failed)
    return result


def digits_run(workdir: str, outdir: str, seconds: float, timeout: int, device: str = 'cuda',
               score_args: tuple[str, ...] = ()) -> dict:
    """DIGITS_COMMAND on `device` for `seconds`, then stopped (snapshots are written whole or not at all); its last
    snapshot scored by bench/quickstart_quality.py on `device` (with `score_args`), its last grid copied to
    outdir/digits-fakes.png."""
    runs = os.path.join(workdir, 'digits')
    command = [sys.executable, *DIGITS_COMMAND, f'--outdir={runs}', f'--device={device}']
    start = time.perf_counter()
    with open(os.path.join(workdir, 'digits-train.log'), 'w') as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode = process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait()
            returncode = 'stopped after the time box'
    result = dict(command=' '.join(command[1:]), returncode=returncode, seconds=time.perf_counter() - start,
                  log='logs.tar.gz: digits-train.log')
    snapshots = sorted(glob.glob(os.path.join(runs, '*', 'network-snapshot-*.pkl')))
    grids = sorted(glob.glob(os.path.join(runs, '*', 'fakes[0-9]*.png')))
    if grids:
        shutil.copyfile(grids[-1], os.path.join(outdir, 'digits-fakes.png'))
        result['grid'] = f'digits-fakes.png (from {os.path.basename(grids[-1])})'
    if not snapshots:
        result['score'] = None
        return result
    result['snapshot'] = os.path.basename(snapshots[-1])
    score = _json_bench('bench/quickstart_quality.py', [f'--network={snapshots[-1]}', f'--device={device}', *score_args],
                        workdir, 'digits-quality', timeout)
    result['score'] = score
    return result


def _json_bench(script: str, extra: List[str], workdir: str, name: str, timeout: int) -> dict:
    """A bench/ script that writes --out=JSON, run in a subprocess; its JSON under 'data'."""
    json_path = os.path.join(workdir, f'{name}.json')
    result = _run([sys.executable, script, f'--out={json_path}', *extra], os.path.join(workdir, f'{name}.log'),
                  timeout)
    if os.path.isfile(json_path):
        with open(json_path) as f:
            result['data'] = json.load(f)
    return result


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


def _step_status(result: Optional[dict]) -> str:
    if result is None:
        return 'not run: no GPU'
    return (f'`{result["command"]}`: exit status {result["returncode"]}, {result["seconds"]:.0f} s '
            f'(log: {result["log"]})')


def markdown(report: dict) -> str:
    env = report['environment']
    gpus = ', '.join(f'{g["name"]} (sm {g["capability"]}, {g["memory_gib"]} GiB)' for g in env['gpus']) or 'no GPU'
    lines = [f'## GPU report, {env["date"]}', '',
             f'- Device: {gpus}',
             f'- torch {env["torch"]} (CUDA {env["torch_cuda"]}), Python {env["python"]}, {env["platform"]}',
             f'- CUDA toolkit found by custom_ops: {env["cuda_home"]}; TORCH_CUDA_ARCH_LIST {env["arch_list"]}',
             f'- Command: `python bench/gpu_report.py{" --quick" if report["quick"] else ""}`, '
             f'{report["seconds"]:.0f} s in all', '',
             '### Build (torch_utils/custom_ops.py)', '']
    if report['build'] is None:
        lines.append(f'Not run: this torch ({env["torch"]}) has no CUDA support.')
    else:
        for name, result in report['build'].items():
            if result['ok']:
                lines.append(f'- {name}: built/loaded in {result["seconds"]:.1f} s ({result["library"]})')
            else:
                lines.append(f'- {name}: **FAILED** after {result["seconds"]:.1f} s: {result["cause"]}')
                lines += [f'    - `{line}`' for line in result['details']]
    lines += ['', '### Self-check (first use of each configuration)', '']
    if report['self_check'] is None:
        lines.append('Not run: no GPU.' if not env['gpus'] else 'Not run: the plugins did not build.')
    else:
        rows = report['self_check']
        lines += _table(rows, ['op', 'dtype', 'error', 'tolerance', 'where', 'ms', 'ok', 'cause'])
        lines += ['', f'{len(rows)} checks, {sum(r["ms"] for r in rows):.0f} ms in all; error is the largest '
                      '|CUDA - float64 reference| / (|reference| + rms(reference)) per element, over value, '
                      '1st and 2nd order gradients.']
    lines += ['', '### Kernel or reference (the chooser, first use of each shape)', '']
    if report['choices'] is None:
        lines.append('Not run: no GPU.' if not env['gpus'] else 'Not run: the plugins did not build.')
    else:
        lines += _table(report['choices'], ['op', 'shape', 'dtype', 'kernel_ms', 'reference_ms', 'chosen'])
    lines += ['', '### Test suite (python -m pytest, GPU visible)', '', _step_status(report['test_suite'])]
    tests = report['test_suite']
    if tests is not None and 'tests' in tests:
        lines.append(f'{tests["passed"]} passed, {tests["failures"]} failed, {tests["errors"]} errors, '
                     f'{tests["skipped"]} skipped')
        lines += [f'- FAILED {f["test"]}: {f["message"]}' for f in tests['failed']]
    lines += ['', '### Ops (bench/ops.py)', '', _step_status(report['bench_ops'])]
    data = (report['bench_ops'] or {}).get('data')
    if data:
        lines += [''] + _table(data['results'], ['op', 'shape', 'dtype', 'pass_name', 'ref_ms', 'cuda_ms', 'speedup', 'ref_GBps',
                                                 'cuda_GBps'])
        bad = [c for c in data['checks'] if not c['ok']]
        lines += ['', f'CUDA against the float64 reference before timing: {len(data["checks"]) - len(bad)} of '
                      f'{len(data["checks"])} cases within tolerance.']
        lines += [f'- FAIL {c["op"]} {c["shape"]} {c["dtype"]}: {c["where"]} off by {c["max_relative_error"]:.2g}'
                  for c in bad]
    for key, title, _, _ in TRAINING_RUNS:
        lines += ['', f'### {title}', '', _step_status(report[key])]
        rows = ((report[key] or {}).get('data') or {}).get('results')
        if rows:
            lines += [''] + _table(rows, list(dict.fromkeys(k for r in rows for k in r)))
    lines += ['', '### GN-StyleGAN on the embedded digits, time-boxed, scored (bench/quickstart_quality.py)', '',
              _step_status(report['digits'])]
    digits = report['digits']
    if digits is not None:
        lines.append(f'Last snapshot: {digits.get("snapshot", "none")}; grid: {digits.get("grid", "none")}.')
        rows = ((digits.get('score') or {}).get('data') or {}).get('rows')
        if rows:
            lines += [''] + _table(rows, ['name', 'num', 'confident', 'classes', 'as_asked', 'fd'])
    return '\n'.join(lines) + '\n'


def _write(path: str, text: str) -> None:
    with dnnlib.util.atomic_path(path) as tmp, open(tmp, 'w') as f:
        f.write(text)


def _archive_logs(workdir: str, outdir: str) -> None:
    """Every step's log into outdir/logs.tar.gz (one file, however many steps ran)."""
    logs = sorted(glob.glob(os.path.join(workdir, '*.log')))
    if logs:
        with dnnlib.util.atomic_path(os.path.join(outdir, 'logs.tar.gz')) as tmp, tarfile.open(tmp, 'w:gz') as tar:
            for log in logs:
                tar.add(log, arcname=os.path.basename(log))


def run_steps(report: dict, quick: bool, timeout: int, workdir: str, outdir: str) -> None:
    """Steps 2-8 of the module docstring, each recorded in `report` as it finishes."""
    gpu = _has_gpu()
    if torch.version.cuda is not None:
        click.echo('Building the plugins...')
        report['build'] = build()
    built = report['build'] is not None and all(r['ok'] for r in report['build'].values())
    if not gpu:
        return
    if built:
        click.echo('Self-check...')
        report['self_check'] = self_check()
        click.echo('Kernel or reference...')
        report['choices'] = op_choices()
    click.echo('Test suite...')
    report['test_suite'] = run_test_suite(workdir, timeout)
    click.echo('bench/ops.py...')
    ops_args = ['--repeats=5', '--warmup=2', '--sizes=8,32'] if quick else []
    report['bench_ops'] = _json_bench('bench/ops.py', ops_args, workdir, 'bench-ops', timeout)
    for key, _, speed_args, quick_args in TRAINING_RUNS:
        speed_args = speed_args + (quick_args if quick else [])
        click.echo(f'bench/train_speed.py {" ".join(speed_args)}...')
        report[key] = _json_bench('bench/train_speed.py', speed_args, workdir, key.replace('_', '-'), timeout)
    click.echo(f'Digits: {DIGITS_SECONDS[quick]} s of training, then scoring...')
    report['digits'] = digits_run(workdir, outdir, DIGITS_SECONDS[quick], timeout)


@click.command()
@click.option('--outdir', default='gpu-report', show_default=True, type=click.Path(file_okay=False),
              help='Where report.md, report.json, logs.tar.gz and digits-fakes.png go.')
@click.option('--quick', is_flag=True, help='Fewer benchmark repeats and configurations, 90 s of digits training '
              '(about nine minutes on one H100/H200).')
@click.option('--timeout', type=click.IntRange(min=60), default=3600, show_default=True,
              help='Seconds allowed to each subprocess step.')
def main(outdir: str, quick: bool, timeout: int) -> None:
    """Build, self-check, test and benchmark on this GPU; write a Markdown + JSON report."""
    if os.path.exists(outdir) and not os.path.isdir(outdir):
        raise click.ClickException(f'--outdir: {outdir} exists and is not a directory')
    created = not os.path.exists(outdir)
    os.makedirs(outdir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix='gpu-report-')
    start = time.perf_counter()
    try:
        report = dict(quick=quick, environment=environment(), build=None, self_check=None, choices=None,
                      test_suite=None, bench_ops=None, digits=None, **{key: None for key, _, _, _ in TRAINING_RUNS})
        click.echo(f'GPU: {", ".join(g["name"] for g in report["environment"]["gpus"]) or "no GPU"}')
        run_steps(report, quick, timeout, workdir, outdir)
        report['seconds'] = time.perf_counter() - start
        text = markdown(report)
        _archive_logs(workdir, outdir)
        _write(os.path.join(outdir, 'report.json'), json.dumps(report, indent=2, default=str))
        _write(os.path.join(outdir, 'report.md'), text)
    except BaseException:
        if created and not os.listdir(outdir):
            os.rmdir(outdir)
        raise
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    click.echo(text)
    click.echo(f'Wrote {os.path.join(outdir, "report.md")} and report.json in {report["seconds"]:.0f} s')
    failures = [name for name, r in (report['build'] or {}).items() if not r['ok']]
    failures += [f'self-check {r["op"]} {r["dtype"]}' for r in report['self_check'] or [] if not r['ok']]
    failures += [name for name in ('test_suite', 'bench_ops', *[key for key, _, _, _ in TRAINING_RUNS])
                 if report[name] is not None and report[name].get('returncode', 0) != 0]
    score = ((report['digits'] or {}).get('score') or {})
    if report['digits'] is not None and score.get('returncode', 1) != 0:
        failures.append('digits (no snapshot scored)')
    if failures:
        click.echo(f'Failed: {", ".join(failures)}', err=True)
        sys.exit(1)


if __name__ == '__main__':
    main()  # pylint: disable=no-value-for-parameter
