"""Hostile files, built without allocating what they claim: zip and npz bombs, archives whose entries
claim more bytes than the file holds, truncated archives.

Used by tests/test_hostile_files.py and bench/hostile_files.py. A zip is written here by hand
(local headers, central directory, end record), so that an entry can carry any declared size and a
deflate stream can be repeated rather than computed: the bombs take milliseconds to build.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import struct
import sys
import tempfile
import zipfile
import zlib

import numpy as np
import torch

_CHUNK = 1 << 20  # A bomb is whole MiB of zeros.


@dataclasses.dataclass
class Entry:
    """One zip entry as written: `data` is what is stored (raw for ZIP_STORED, a raw deflate stream for
    ZIP_DEFLATED); crc and file_size describe the uncompressed bytes, compress_size the stored ones."""
    name: str
    data: bytes
    method: int
    crc: int
    file_size: int
    compress_size: int


def stored(name: str, data: bytes) -> Entry:
    return Entry(name, data, zipfile.ZIP_STORED, zlib.crc32(data), len(data), len(data))


def deflated(name: str, data: bytes) -> Entry:
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)  # wbits -15: a raw deflate stream, as zip holds it.
    stream = compressor.compress(data) + compressor.flush()
    return Entry(name, stream, zipfile.ZIP_DEFLATED, zlib.crc32(data), len(data), len(stream))


def deflate_bomb(name: str, num_bytes: int, prefix: bytes = b'') -> Entry:
    """`prefix` followed by zeros up to `num_bytes`, as a deflate stream of about num_bytes / 1000 bytes:
    one MiB of zeros compressed with a full flush (byte-aligned, no reference to earlier data) repeated,
    the remainder, then an empty final block (fixed Huffman: bits 1, 01, 0000000)."""
    def flushed(data: bytes) -> bytes:
        compressor = zlib.compressobj(9, zlib.DEFLATED, -15)  # wbits -15: a raw deflate stream, as zip holds it.
        return compressor.compress(data) + compressor.flush(zlib.Z_FULL_FLUSH)
    num_chunks, remainder = divmod(num_bytes - len(prefix), _CHUNK)
    stream = flushed(prefix) + flushed(bytes(_CHUNK)) * num_chunks + flushed(bytes(remainder)) + b'\x03\x00'
    crc, chunk = zlib.crc32(prefix), bytes(_CHUNK)
    for _ in range(num_chunks):
        crc = zlib.crc32(chunk, crc)
    crc = zlib.crc32(bytes(remainder), crc)
    return Entry(name, stream, zipfile.ZIP_DEFLATED, crc, num_bytes, len(stream))


def _sizes(e: Entry) -> tuple[int, int, bytes]:
    """(compressed, uncompressed) sizes as the headers hold them, and the extra field: sizes of 4 GiB and
    more are 0xFFFFFFFF there and in a zip64 extra field (id 1, 16 bytes: uncompressed, compressed)."""
    if max(e.file_size, e.compress_size) < 0xFFFFFFFF:
        return e.compress_size, e.file_size, b''
    return 0xFFFFFFFF, 0xFFFFFFFF, struct.pack('<HHQQ', 1, 16, e.file_size, e.compress_size)


def _central_header(e: Entry, offset: int) -> bytes:
    """Central directory header: signature, made-by and needed versions, flags, method, time, date, crc,
    sizes, name / extra / comment lengths, disk, attributes, the local header's offset; then name and extra."""
    name, (compress_size, file_size, extra) = e.name.encode(), _sizes(e)
    return struct.pack('<IHHHHHHIIIHHHHHII', 0x02014b50, 45, 45, 0, e.method, 0, 0x21, e.crc, compress_size,
                       file_size, len(name), len(extra), 0, 0, 0, 0, offset) + name + extra


def _end_record(num_entries: int, directory_size: int, directory_offset: int) -> bytes:
    """End of central directory: signature, disks, entries on this disk and in all, directory size and offset."""
    return struct.pack('<IHHHHIIH', 0x06054b50, 0, 0, num_entries, num_entries, directory_size, directory_offset, 0)


def zip_bytes(entries: list[Entry]) -> bytes:
    """A zip archive of `entries`, with their declared sizes as given (zip64 sizes from 4 GiB on)."""
    out, central = io.BytesIO(), []
    for e in entries:
        offset, name, (compress_size, file_size, extra) = out.tell(), e.name.encode(), _sizes(e)
        # Local file header: signature, version 4.5, flags, method, time, date, crc, sizes, name and extra lengths.
        out.write(struct.pack('<IHHHHHIIIHH', 0x04034b50, 45, 0, e.method, 0, 0x21, e.crc, compress_size,
                              file_size, len(name), len(extra)) + name + extra + e.data)
        central.append(_central_header(e, offset))
    directory = b''.join(central)
    return out.getvalue() + directory + _end_record(len(entries), len(directory), out.tell())


def overlapping(num_entries: int, num_bytes: int) -> bytes:
    """A zip of one stored entry of `num_bytes` zeros, listed `num_entries` (< 1000) times under other names (as long) in the
    central directory: each entry lies within the file, all of them together claim far more."""
    data = stored('data', bytes(num_bytes))
    local = zip_bytes([data])[:-len(_central_header(data, 0)) - len(_end_record(0, 0, 0))]
    directory = b''.join(_central_header(dataclasses.replace(data, name=f'd{i:03d}'), 0) for i in range(num_entries))
    return local + directory + _end_record(num_entries, len(directory), len(local))


def entries_of(raw: bytes) -> list[Entry]:
    """The entries of a zip archive, uncompressed and stored as they are."""
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        return [stored(info.filename, z.read(info)) for info in z.infolist()]

#----------------------------------------------------------------------------
# Files of the project's formats, made hostile.


def snapshot_bytes() -> bytes:
    """A valid snapshot of a tiny generator, as save_snapshot writes it."""
    from torch_utils import persistence
    from training.networks import sngan
    torch.manual_seed(0)
    G = sngan.CNNGenerator(c_dim=0, img_resolution=16, img_channels=3, ch=4, z_dim=4)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, 'valid.pkl')
        persistence.save_snapshot(path, dict(G=G, G_ema=G))
        with open(path, 'rb') as f:
            return f.read()


def snapshot_bomb(num_bytes: int) -> bytes:
    """The snapshot with its first tensor's entry (data/0) a deflate bomb of `num_bytes` zeros."""
    return zip_bytes([deflate_bomb(e.name, num_bytes) if e.name.endswith('/data/0') else e
                      for e in entries_of(snapshot_bytes())])


def oversized_claim(raw: bytes, suffix: str, num_bytes: int) -> bytes:
    """The archive with the stored entry ending in `suffix` claiming `num_bytes` (more than the file holds)."""
    return zip_bytes([dataclasses.replace(e, file_size=num_bytes, compress_size=num_bytes) if e.name.endswith(suffix) else e
                      for e in entries_of(raw)])


def truncated(raw: bytes) -> bytes:
    """The first half of the archive, as a copy or download that stopped half way leaves it."""
    return raw[:len(raw) // 2]


def npy_header(shape: tuple[int, ...], dtype: str = '<f8') -> bytes:
    """The .npy header (magic, version 1.0, header dict) of an array of `shape` and `dtype`."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, dict(descr=dtype, fortran_order=False, shape=shape))
    return buffer.getvalue()


def stats_bomb(dim: int, sigma_dim: int) -> bytes:
    """Reference statistics: mu [dim] of zeros and a compressed sigma [sigma_dim, sigma_dim] of zeros, float64."""
    mu = np.zeros(dim)
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, mu)
    header = npy_header((sigma_dim, sigma_dim))
    return zip_bytes([stored('mu.npy', buffer.getvalue()), deflate_bomb('sigma.npy', len(header) + 8 * sigma_dim ** 2, header)])


def stats_claiming(sigma_dim: int) -> bytes:
    """Reference statistics whose sigma.npy header claims [sigma_dim, sigma_dim] float64 over a few bytes."""
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.zeros(2048))
    return zip_bytes([stored('mu.npy', buffer.getvalue()), deflated('sigma.npy', npy_header((sigma_dim, sigma_dim)) + bytes(64))])


def png_bytes(value: int = 0, size: int = 16) -> bytes:
    import PIL.Image
    buffer = io.BytesIO()
    PIL.Image.fromarray(np.full([size, size, 3], value, dtype=np.uint8)).save(buffer, format='png')
    return buffer.getvalue()


def dataset_json_bomb(num_bytes: int) -> bytes:
    """A dataset zip of two images whose dataset.json is {"labels": null} followed by `num_bytes` of zeros."""
    prefix = json.dumps(dict(labels=None)).encode()
    return zip_bytes([stored('img0.png', png_bytes(0)), stored('img1.png', png_bytes(100)),
                      deflate_bomb('dataset.json', len(prefix) + num_bytes, prefix)])


def image_entry_bomb(num_bytes: int) -> bytes:
    """A dataset zip whose first image entry is a PNG followed by `num_bytes` of zeros."""
    first = png_bytes(0)
    return zip_bytes([deflate_bomb('img0.png', len(first) + num_bytes, first), stored('img1.png', png_bytes(100))])


def detector_bytes() -> bytes:
    """The tests' tiny TorchScript detector (tests/test_metric_main.py)."""
    from tests.test_metric_main import make_detector
    with tempfile.TemporaryDirectory() as tmp:
        make_detector(os.path.join(tmp, 'detector.pt'))
        with open(os.path.join(tmp, 'detector.pt'), 'rb') as f:
            return f.read()

#----------------------------------------------------------------------------
# Every entry point, run on every kind of hostile file it reads.


@dataclasses.dataclass
class Case:
    entry: str          # The command, as the table shows it.
    file: str           # What is hostile about the file.
    path: str           # The hostile file.
    argv: list[str]     # The script, then its arguments.

    @property
    def file_size(self) -> int:
        return os.path.getsize(self.path)


@dataclasses.dataclass
class Outcome:
    returncode: int
    stderr: str
    peak_rss: int       # Bytes: the child's peak resident memory (Linux: ru_maxrss of wait4).
    seconds: float

    @property
    def last_line(self) -> str:
        lines = self.stderr.strip().splitlines()
        return lines[-1] if lines else ''


def hostile_cases(folder: str, bomb_bytes: int) -> list[Case]:
    """Write the hostile files to `folder` (bombs expanding to `bomb_bytes`) and return the command lines
    that read them, one per entry point and file."""
    def write(name: str, data: bytes) -> str:
        path = os.path.join(folder, name)
        with open(path, 'wb') as f:
            f.write(data)
        return path

    snapshot = snapshot_bytes()
    files = {
        'snapshot zip bomb': write('bomb.pkl', snapshot_bomb(bomb_bytes)),
        'snapshot entry claiming more than the file': write('claims.pkl', oversized_claim(snapshot, '/data/0', bomb_bytes)),
        'truncated snapshot': write('truncated.pkl', truncated(snapshot)),
        'npz bomb (sigma.npy)': write('bomb.npz', stats_bomb(2048, int((bomb_bytes / 8) ** 0.5))),
        'npz claiming 40000x40000': write('claims.npz', stats_claiming(40000)),
        'dataset.json bomb': write('json-bomb.zip', dataset_json_bomb(bomb_bytes)),
        'image entry bomb': write('image-bomb.zip', image_entry_bomb(bomb_bytes)),
        'detector zip bomb': write('detector-bomb.pt', zip_bytes([deflate_bomb(e.name, bomb_bytes) if e.name.endswith('/data/0') else e
                                                                  for e in entries_of(detector_bytes())])),
        'detector not TorchScript': write('not-torchscript.pt', snapshot),
    }
    detector = write('detector.pt', detector_bytes())
    images = write('images.zip', zip_bytes([stored(f'img{i}.png', png_bytes(i * 50)) for i in range(4)]))
    out = os.path.join(folder, 'out')
    cases: list[Case] = []

    def add(entry: str, file: str, *args: str) -> None:
        cases.append(Case(entry, file, files[file], [entry.split()[0], *args]))
    for file in ('snapshot zip bomb', 'snapshot entry claiming more than the file', 'truncated snapshot'):
        add('generate.py --network', file, f'--network={files[file]}', '--seeds=0', f'--outdir={out}')
        add('calc_metrics.py --network', file, f'--network={files[file]}', '--metrics=is50k', f'--detector={detector}', '--num-gen=2')
        add('train.py --resume', file, f'--resume={files[file]}', f'--outdir={out}', '--kimg=0.001')
        add('legacy.py --source', file, f'--source={files[file]}', '--cfg=cifar10-cnn', f'--dest={out}.pkl')
    for file in ('npz bomb (sigma.npy)', 'npz claiming 40000x40000'):
        add('calc_metrics.py --ref-stats', file, f'--images={images}', f'--ref-stats={files[file]}', f'--detector={detector}',
            '--metrics=fid50k_full')
        add('train.py --ref-stats', file, f'--ref-stats={files[file]}', f'--outdir={out}', '--kimg=0.001', '--metrics=fid50k_full')
    for file in ('image entry bomb', 'dataset.json bomb'):
        add('train.py --data', file, f'--data={files[file]}', f'--outdir={out}', '--kimg=0.001')
        add('dataset_tool.py --source', file, f'--source={files[file]}', f'--dest={out}-{len(cases)}.zip')
    add('calc_metrics.py --images', 'image entry bomb', f'--images={files["image entry bomb"]}', f'--detector={detector}',
        '--metrics=is50k', '--num-gen=2')
    for file in ('detector zip bomb', 'detector not TorchScript'):
        add('calc_metrics.py --detector', file, f'--images={images}', f'--detector={files[file]}', '--metrics=is50k', '--num-gen=4')
    return cases


# Runs the command given after it in a child and writes the child's peak resident memory (KiB, Linux's
# ru_maxrss) to the file named first. A child's ru_maxrss counts the memory of the process it was forked
# from, so the child is forked from this small interpreter, not from the test's (torch already imported).
_MEASURE = """import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], 'w') as f:
    f.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_cli(argv: list[str], cwd: str) -> Outcome:
    """Run `python <argv>` (a script of the repository and its arguments) on the CPU (CUDA_VISIBLE_DEVICES='')
    and measure that process alone: exit code, stderr, peak resident memory, wall time."""
    import subprocess
    import time
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES='', PYTHONPATH=repo, GNGAN_CACHE_DIR=os.path.join(cwd, 'cache'))
    with tempfile.TemporaryDirectory() as tmp:
        peak_file = os.path.join(tmp, 'peak')
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, '-S', '-c', _MEASURE, peak_file, os.path.join(repo, argv[0]), *argv[1:]],
                              cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        seconds = time.perf_counter() - start
        with open(peak_file) as f:
            peak_kib = int(f.read())
    return Outcome(proc.returncode, proc.stderr.decode(errors='replace'), peak_kib * 1024, seconds)
