"""dataset_tool.py's conversion speed by number of worker processes.

    python -m bench.dataset_tool_speed                               # 512 and 1024, PNG and WebP, 1 to all cores
    python -m bench.dataset_tool_speed --sizes=1024 --formats=png --workers=1,2,4,8,16 --out=speed.json

Synthetic sources (a folder of photo-like images: smooth color fields with noise, so that they compress as
photos do rather than as noise or flat color) are converted to --resolution (default 256x256, as for CelebA-HQ
and LSUN Church) with each number of workers, in this process, as `python dataset_tool.py` converts them
(the interpreter's start is left out). Each archive is checked to be byte-identical to the one-worker archive.
Prints a Markdown table of images per second, the speed-up over one worker, and the CPU time of the main process
(reading, writing) and of the workers (decoding, resizing, encoding): the main process's share bounds the speed-up
on any number of cores. --out writes JSON, with the machine and its load while it ran (the other processes' CPU use).
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import contextlib
import datetime
import hashlib
import io
import os
import platform
import resource
import shutil
import tempfile
import time

import click
import numpy as np
import PIL.Image
import psutil

import dataset_tool
from bench.common import parse_list, write_json_atomic

DISTINCT_IMAGES = 8  # Encoded once each and written under every name: a source of thousands costs no more to make.

#----------------------------------------------------------------------------


def photo_like(rng: np.random.Generator, size: int) -> np.ndarray:
    """uint8 [size, size, 3]: a few low-frequency color waves plus Gaussian noise (sigma 6)."""
    y, x = np.meshgrid(np.linspace(0, 1, size), np.linspace(0, 1, size), indexing='ij')
    channels = []
    for _ in range(3):
        fx, fy, phase = rng.uniform(1, 4), rng.uniform(1, 4), rng.uniform(0, 2 * np.pi)
        channels.append(128 + 90 * np.sin(2 * np.pi * (fx * x + fy * y) + phase))
    pixels = np.stack(channels, axis=2) + rng.normal(0, 6, size=[size, size, 3])
    return np.clip(pixels, 0, 255).astype(np.uint8)


def write_source(folder: str, size: int, fmt: str, count: int) -> int:
    """`count` images of size x size in `fmt` (png, or lossy webp as LSUN's) in `folder`; returns their total bytes."""
    rng = np.random.default_rng(size)
    encoded = []
    for _ in range(DISTINCT_IMAGES):
        path = os.path.join(folder, f'encode.{fmt}')
        PIL.Image.fromarray(photo_like(rng, size)).save(path, **({'quality': 90} if fmt == 'webp' else {}))
        with open(path, 'rb') as f:
            encoded.append(f.read())
        os.remove(path)
    for idx in range(count):
        with open(os.path.join(folder, f'{idx:06d}.{fmt}'), 'wb') as f:
            f.write(encoded[idx % DISTINCT_IMAGES])
    return sum(len(encoded[idx % DISTINCT_IMAGES]) for idx in range(count))


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def convert(source: str, dest: str, resolution: int, workers: int) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds of this process, CPU seconds of the workers) that dataset_tool.py takes to convert
    `source` with `workers` processes. This process's share bounds the speed-up whatever the cores: at most
    (main + workers) / main. The tool's closing line is left out of the table."""
    start, main, children = time.perf_counter(), cpu_seconds(resource.RUSAGE_SELF), cpu_seconds(resource.RUSAGE_CHILDREN)
    with contextlib.redirect_stdout(io.StringIO()):
        dataset_tool.main.main([f'--source={source}', f'--dest={dest}', f'--resolution={resolution}x{resolution}',
                                f'--workers={workers}'], standalone_mode=False)
    return (time.perf_counter() - start, cpu_seconds(resource.RUSAGE_SELF) - main,
            cpu_seconds(resource.RUSAGE_CHILDREN) - children)


def sha256(path: str) -> str:
    with open(path, 'rb') as f:
        return hashlib.sha256(f.read()).hexdigest()


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what platform knows."""
    try:
        with open('/proc/cpuinfo') as f:
            return next(line.split(':', 1)[1].strip() for line in f if line.startswith('model name'))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def other_processes(top: int = 5) -> list[str]:
    """The `top` other processes by CPU use over one second ('name pid: percent of one core')."""
    procs = [p for p in psutil.process_iter(['name']) if p.pid != os.getpid()]
    for p in procs:
        try:
            p.cpu_percent(None)
        except psutil.Error:
            pass
    time.sleep(1.0)
    usage = []
    for p in procs:
        try:
            usage.append((p.cpu_percent(None), f'{p.info["name"]} {p.pid}'))
        except psutil.Error:
            pass
    return [f'{name}: {percent:.0f}%' for percent, name in sorted(usage, reverse=True)[:top] if percent > 0]

#----------------------------------------------------------------------------


@click.command()
@click.option('--sizes',      help='Source image sizes (square)', metavar='INT,...', default='512,1024', show_default=True,
              callback=parse_list(('256', '512', '1024', '2048')))
@click.option('--formats',    help='Source image formats', metavar='png,webp', default='png,webp', show_default=True,
              callback=parse_list(('png', 'webp')))
@click.option('--images',     help='Images per source at 512x512 (a quarter as many at 1024x1024: about the same work)', metavar='INT',
              type=click.IntRange(min=1), default=400, show_default=True)
@click.option('--resolution', help='Output resolution', metavar='INT', type=click.IntRange(min=1), default=256, show_default=True)
@click.option('--workers',    help='Numbers of workers to time  [default: 1, 2, 4, ... and one per core]', metavar='INT,...')
@click.option('--out',        help='Write the results as JSON to this file', metavar='JSON')
def main(sizes: list[str], formats: list[str], images: int, resolution: int, workers: str | None, out: str | None) -> None:
    """dataset_tool.py's conversion speed by number of worker processes, on synthetic PNG and WebP sources."""
    cores = dataset_tool.default_workers()
    counts = sorted({int(w) for w in workers.split(',')} if workers else {2**i for i in range(cores.bit_length()) if 2**i < cores} | {1, cores})
    machine = dict(cpu=cpu_model(), cores=cores, python=platform.python_version(), pillow=PIL.__version__)
    busy_before = other_processes()
    print(f'{cores} cores; other processes before: {", ".join(busy_before) or "none"}')
    print('| source | images | workers | seconds | images/s | speed-up | CPU s: main / workers | same bytes |')
    print('|---|---|---|---|---|---|---|---|')
    rows = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as folder:
        for size in map(int, sizes):
            for fmt in formats:
                source = os.path.join(folder, f'{fmt}{size}')
                os.makedirs(source)
                count = max(1, images * 512**2 // size**2)
                source_bytes = write_source(source, size, fmt, count)
                baseline, reference = None, None
                for num in counts:
                    dest = os.path.join(folder, f'out-{num}.zip')
                    seconds, main_cpu, worker_cpu = convert(source, dest, resolution, num)
                    digest = sha256(dest)
                    os.remove(dest)
                    baseline = baseline or seconds
                    reference = reference or digest
                    rows.append(dict(size=size, format=fmt, images=count, source_bytes=source_bytes, resolution=resolution, workers=num,
                                     seconds=seconds, images_per_second=count / seconds, speedup=baseline / seconds,
                                     main_cpu_seconds=main_cpu, worker_cpu_seconds=worker_cpu, identical=digest == reference))
                    print(f'| {size}x{size} {fmt.upper()} to {resolution}x{resolution} | {count} | {num} | {seconds:.1f} | '
                          f'{count / seconds:.1f} | {baseline / seconds:.2f}x | {main_cpu:.1f} / {worker_cpu:.1f} | '
                          f'{"yes" if digest == reference else "NO"} |', flush=True)
                shutil.rmtree(source)
    load_after = os.getloadavg()
    busy_after = other_processes()
    print(f'load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after; other processes after: {", ".join(busy_after) or "none"}')
    if out is not None:
        write_json_atomic(out, dict(date=datetime.date.today().isoformat(), machine=machine, load_average_before=load_before,
                                    load_average_after=load_after, other_processes_before=busy_before, other_processes_after=busy_after,
                                    rows=rows))


if __name__ == '__main__':
    main()
