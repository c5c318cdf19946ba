"""Hostile files, built without allocating what they claim: zip, npz and tar bombs, archives whose entries
claim more bytes than the file holds, truncated archives, pickles and LMDB databases made to take memory,
and a server on 127.0.0.1 for downloads larger than their cap; the command lines of every entry point that reads
them (hostile_cases), and how each is run and measured (run_cli, run_entry_point).

A part of `python -m bench.hostile_files`, which measures the refusals; tests/test_hostile_files.py checks them, and
other tests use its files (tests/test_dataset_tool.py, tests/test_nvidia_pickle.py, tests/test_util.py). A zip is
written here by hand (local headers, central directory, end record), so that an entry can carry any declared size
and a deflate stream can be repeated rather than computed: the bombs take milliseconds to build.
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import collections
import dataclasses
import gzip
import http.server
import importlib.util
import io
import json
import os
import pickle
import struct
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
import zlib
from typing import Callable

import numpy as np
import torch

from bench.common import module_command

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


def deflate_repeated(pieces: list[tuple[bytes, int]]) -> tuple[bytes, int, int]:
    """(raw deflate stream, CRC-32, size) of the bytes `block` repeated `count` times for each (block, count) in turn:
    each block is compressed once with a full flush (byte-aligned, no reference to earlier data) and its stream
    repeated, then an empty final block (fixed Huffman: bits 1, 01, 0000000) ends it."""
    stream, crc, size = [], 0, 0
    for block, count in pieces:
        compressor = zlib.compressobj(9, zlib.DEFLATED, -15)  # wbits -15: a raw deflate stream, as zip holds it.
        stream.append((compressor.compress(block) + compressor.flush(zlib.Z_FULL_FLUSH)) * count)
        for _ in range(count):
            crc = zlib.crc32(block, crc)
        size += len(block) * count
    return b''.join(stream) + b'\x03\x00', crc, size


def zeros(num_bytes: int) -> list[tuple[bytes, int]]:
    """`num_bytes` zeros as pieces of deflate_repeated: whole MiB and the remainder."""
    num_chunks, remainder = divmod(num_bytes, _CHUNK)
    return [(bytes(_CHUNK), num_chunks), (bytes(remainder), 1)]


def deflate_bomb(name: str, num_bytes: int, prefix: bytes = b'') -> Entry:
    """`prefix` followed by zeros up to `num_bytes`, as a deflate stream of about num_bytes / 1000 bytes."""
    stream, crc, size = deflate_repeated([(prefix, 1)] + zeros(num_bytes - len(prefix)))
    return Entry(name, stream, zipfile.ZIP_DEFLATED, crc, size, len(stream))


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


class StandInDetector(torch.nn.Module):
    """A detector with the calling convention of the metrics' (uint8 [N, 3, H, W] of any size -> features [N, 6], or
    class probabilities [N, 5]) and random weights: what calc_metrics.py loads as --detector, so that a case gets
    as far as the hostile file it is about."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Linear(3 * 2 * 2, 6)
        self.logits = torch.nn.Linear(6, 5)

    def forward(self, x: torch.Tensor, return_features: bool = False, no_output_bias: bool = False) -> torch.Tensor:
        features = self.features(torch.nn.functional.adaptive_avg_pool2d(x.to(torch.float32) / 255, [2, 2]).flatten(1))
        if return_features:
            return features
        logits = features @ self.logits.weight.t()
        return torch.softmax(logits if no_output_bias else logits + self.logits.bias, dim=1)


def detector_bytes() -> bytes:
    """StandInDetector as TorchScript, as a file named detector.pt holds it (its entries under detector/)."""
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        torch.jit.script(StandInDetector().eval()).save(os.path.join(tmp, 'detector.pt'))
        with open(os.path.join(tmp, 'detector.pt'), 'rb') as f:
            return f.read()

#----------------------------------------------------------------------------
# Tar archives (dataset_tool's CIFAR-10 and STL-10 sources), CIFAR-10 batches, LMDB databases.


def tar_header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    """The 512-byte header of a member `name` of `size` bytes (GNU format: any size), without its data."""
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info.tobuf(tarfile.GNU_FORMAT)


def _blocks(num_bytes: int) -> int:
    """The bytes of `num_bytes` of member data in a tar: whole 512-byte blocks."""
    return -(-num_bytes // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def tar_bytes(members: list[tuple[str, bytes]]) -> bytes:
    """A plain tar archive of (name, data) members."""
    out = b''.join(tar_header(name, len(data)) + data.ljust(_blocks(len(data)), b'\0') for name, data in members)
    return out + bytes(2 * tarfile.BLOCKSIZE)


def gzip_repeated(pieces: list[tuple[bytes, int]]) -> bytes:
    """A gzip file of deflate_repeated(pieces): header (magic, deflate, no flags, no time, no extra flags, Unix),
    the deflate stream, CRC-32 and size modulo 2^32."""
    stream, crc, size = deflate_repeated(pieces)
    return b'\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03' + stream + struct.pack('<II', crc, size & 0xFFFFFFFF)


def tar_gz_bomb(name: str, num_bytes: int) -> bytes:
    """A tar.gz of one member `name` of `num_bytes` zeros: about num_bytes / 1000 bytes."""
    return gzip_repeated([(tar_header(name, num_bytes), 1)] + zeros(_blocks(num_bytes) + 2 * tarfile.BLOCKSIZE))


def tar_claiming(name: str, num_bytes: int) -> bytes:
    """A plain tar whose member `name` claims `num_bytes` and holds 512."""
    return tar_header(name, num_bytes) + bytes(3 * tarfile.BLOCKSIZE)


def tar_gz_of_empty_members(count: int, name: str = 'x') -> bytes:
    """A tar.gz of `count` empty members, all called `name`: tarfile keeps a header object for each one listed."""
    per_chunk = _CHUNK // tarfile.BLOCKSIZE
    header = tar_header(name, 0)
    return gzip_repeated([(header * per_chunk, count // per_chunk), (header * (count % per_chunk), 1),
                          (bytes(2 * tarfile.BLOCKSIZE), 1)])


def tar_gz_pax_bomb(num_bytes: int) -> bytes:
    """A tar.gz whose first member's pax header record claims `num_bytes` (zeros), which tarfile reads whole."""
    return gzip_repeated([(tar_header('././@PaxHeader', num_bytes, tarfile.XHDTYPE), 1)] +
                         zeros(_blocks(num_bytes)) + [(tar_header('data_batch_1', 0) + bytes(2 * tarfile.BLOCKSIZE), 1)])


def cifar_tar_gz(batches: dict[str, bytes]) -> bytes:
    """cifar-10-python.tar.gz's layout: cifar-10-batches-py/<name> members holding the given bytes, gzip-compressed."""
    return gzip.compress(tar_bytes([(f'cifar-10-batches-py/{name}', data) for name, data in batches.items()]))


def memo_bomb_pickle(num_bytes: int) -> bytes:
    """A pickle of 9 bytes that makes Python's C unpickler take `num_bytes`: it stores None at memo index
    num_bytes / 16 (LONG_BINPUT), and the unpickler grows its memo to twice the index, 8 bytes an entry."""
    return b'\x80\x02N' + b'r' + struct.pack('<I', min(num_bytes // 16, 0xFFFFFFFF)) + b'.'


def object_array_pickle(num_items: int) -> bytes:
    """A CIFAR-10 batch whose data is an array of `num_items` Python objects whose state lists one: numpy sets
    such a state unchecked (the process crashes), using only the globals a batch needs."""
    class Array:
        def __reduce__(self):
            return (_reconstruct(), (np.ndarray, (0,), b'b'),
                    (1, (num_items,), np.dtype(object), False, [None]))
    return pickle.dumps({b'data': Array(), b'labels': []}, protocol=2)


def _reconstruct():
    """numpy's _reconstruct, where this numpy keeps it."""
    try:
        from numpy._core.multiarray import _reconstruct as reconstruct
    except ImportError:
        from numpy.core.multiarray import _reconstruct as reconstruct
    return reconstruct


# NVIDIA-style pickles (torch_utils/nvidia_pickle.py): what NVIDIA's torch_utils/persistence.py writes, made here
# from this project's StyleGAN2 networks, which have NVIDIA's class names, kwargs and state.

def nvidia_source(flag: str | None = None, generator_args: str = 'mapping_kwargs={}, synthesis_kwargs={}',
                  classes: tuple[str, ...] = ('FullyConnectedLayer', 'MappingNetwork', 'Conv2dLayer', 'SynthesisLayer',
                                              'ToRGBLayer', 'SynthesisBlock', 'SynthesisNetwork', 'DiscriminatorBlock',
                                              'MinibatchStdLayer', 'DiscriminatorEpilogue', 'Discriminator')) -> str:
    """A module source with the persistent classes of NVIDIA's training/networks.py (bodies elided) and, with `flag`,
    a first line that writes that file if the source is ever run. `generator_args`: Generator's last parameters
    ('mapping_kwargs={}, **synthesis_kwargs' is the StyleGAN3 repository's)."""
    lines = [f'import pathlib; pathlib.Path({flag!r}).write_text("the embedded source ran")'] if flag else []
    lines += ['import torch', 'from torch_utils import persistence', '', '@persistence.persistent_class',
              f'class Generator(torch.nn.Module):',
              f'    def __init__(self, z_dim, c_dim, w_dim, img_resolution, img_channels, {generator_args}):',
              '        super().__init__()']
    for name in classes:
        lines += ['', '@persistence.persistent_class', f'class {name}(torch.nn.Module):', '    pass']
    return '\n'.join(lines) + '\n'


def _reconstruct_persistent_obj(meta: dict) -> None:
    raise AssertionError('a stand-in, pickled by name only')


def nvidia_pickle(entries: dict, source: str | Callable[[torch.nn.Module], str], class_names: dict | None = None,
                  protocol: int = 3, init_args: tuple = ()) -> bytes:
    """pickle.dump of `entries` as NVIDIA's code writes it: each torch.nn.Module (ours, of the same names) as a call of
    torch_utils.persistence._reconstruct_persistent_obj on {type, version, module_src, class_name, state}, the state
    its __dict__ with _init_args `init_args` and _init_kwargs (a dnnlib.util.EasyDict). `class_names` renames classes;
    `source` may be a function of the module (each module its own source)."""
    import dnnlib
    from torch_utils import persistence
    stand_in = _reconstruct_persistent_obj
    stand_in.__module__, stand_in.__qualname__ = 'torch_utils.persistence', '_reconstruct_persistent_obj'

    class Pickler(pickle.Pickler):
        def reducer_override(self, obj):
            if not isinstance(obj, torch.nn.Module):
                return NotImplemented
            state = {k: v for k, v in obj.__dict__.items() if k != 'init_kwargs'}
            state.update(_init_args=init_args, _init_kwargs=dnnlib.EasyDict(obj.init_kwargs))
            name = (class_names or {}).get(type(obj).__name__, type(obj).__name__)
            module_src = source(obj) if callable(source) else source
            return stand_in, (dict(type='class', version=6, module_src=module_src, class_name=name, state=state),)

    f = io.BytesIO()
    persistence._reconstruct_persistent_obj = stand_in
    try:
        Pickler(f, protocol=protocol).dump(entries)
    finally:
        del persistence._reconstruct_persistent_obj
    return f.getvalue()


def nvidia_networks(c_dim: int = 0, resolution: int = 8, seed: int = 0) -> dict:
    """A small StyleGAN2 G, D and G_ema of this project (NVIDIA's classes and kwargs), random weights."""
    from training.networks import stylegan2
    torch.manual_seed(seed)
    G = stylegan2.Generator(z_dim=8, c_dim=c_dim, w_dim=8, img_resolution=resolution, img_channels=3,
                            mapping_kwargs={'num_layers': 2}, synthesis_kwargs={'channel_base': 128, 'channel_max': 16})
    D = stylegan2.Discriminator(c_dim=c_dim, img_resolution=resolution, img_channels=3, channel_base=128, channel_max=16,
                                epilogue_kwargs={'mbstd_group_size': 2})
    with torch.no_grad():
        for p in [*G.parameters(), *D.parameters(), G.mapping.w_avg]:
            p.copy_(torch.randn_like(p) * 0.5)
    return {'G': G.eval(), 'D': D.eval(), 'G_ema': G.eval()}


class PickledCall:
    """An object that pickles as a call of `function` on `args`."""

    def __init__(self, function, *args) -> None:
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


def nvidia_pickle_calling_os_system(flag: str) -> bytes:
    """An NVIDIA-style snapshot whose augment_pipe is os.system('touch <flag>')."""
    return nvidia_pickle(dict(nvidia_networks(), augment_pipe=PickledCall(os.system, f'touch {flag}')), nvidia_source())


def _legacy_storage(dtype_name: str, numel: int, data: bytes) -> bytes:
    """torch.save(storage, _use_new_zipfile_serialization=False) of a storage that declares `numel` elements
    of torch.<dtype_name> and carries `data`."""
    f = io.BytesIO()
    for value in (0x1950a86a20f9469cfc6c, 1001, {'protocol_version': 1001, 'little_endian': True,
                                                 'type_sizes': {'short': 2, 'int': 4, 'long': 4}}):
        pickle.dump(value, f, protocol=2)
    storage = PickledCall(int)  # Pickled as its persistent id.
    pickler = pickle.Pickler(f, protocol=2)
    pickler.persistent_id = lambda obj: ('storage', getattr(torch, dtype_name), '0', 'cpu', numel, None) if obj is storage else None
    pickler.dump(storage)
    pickle.dump(['0'], f, protocol=2)
    return f.getvalue() + struct.pack('<q', numel) + data


def nvidia_storage_bomb(num_bytes: int) -> bytes:
    """An NVIDIA-style snapshot whose G's mapping.w_avg is a float32 storage declaring `num_bytes` (16 are carried)."""
    networks = nvidia_networks()
    numel = num_bytes // 4
    storage = PickledCall(torch.storage._load_from_bytes, _legacy_storage('FloatStorage', numel, bytes(16)))
    networks['G'].mapping._buffers['w_avg'] = PickledCall(torch._utils._rebuild_tensor_v2, storage, 0, (numel,), (1,), False,
                                                    collections.OrderedDict())
    return nvidia_pickle(networks, nvidia_source())


def nvidia_deep_nesting(depth: int) -> bytes:
    """An NVIDIA-style snapshot whose training_set_kwargs hold lists nested `depth` deep (written opcode by opcode:
    pickle.dump recurses): EMPTY_LIST depth times, then APPEND depth - 1 times."""
    prefix = nvidia_pickle(nvidia_networks(), nvidia_source())
    assert prefix.endswith(b'u.')  # ... SETITEMS, STOP: the snapshot dict is still on the stack.
    key = 'training_set_kwargs'.encode()
    return prefix[:-1] + b'X' + struct.pack('<I', len(key)) + key + b']' * depth + b'a' * (depth - 1) + b's.'


# NVIDIA-style pickles made to take memory or time, or to break the reader (issue of the variants: their names are
# those of the attack that found them). Each is small; `scale` sets what it expands to.

def _shared_dicts(depth: int) -> dict:
    """{'a': d, 'b': d} nested `depth` deep over one dict d at each level: 2^depth paths, depth + 1 dicts."""
    value: dict = {'x': 1}
    for _ in range(depth):
        value = {'a': value, 'b': value}
    return value


def _shared_tuples(depth: int, memo_start: int) -> bytes:
    """The opcodes that push (t, t) nested `depth` deep (t: the tuple one level down), memoized from entry `memo_start`
    on: hashing it visits 2^(depth + 1) - 1 tuples. Written opcode by opcode: Python would hash it to make the dict."""
    index = lambda i: struct.pack('<I', memo_start + i)  # noqa: E731
    ops = [b')r' + index(0)]  # EMPTY_TUPLE, LONG_BINPUT
    for level in range(depth):
        ops.append(b'j' + index(level) + b'j' + index(level) + b'\x86r' + index(level + 1))  # LONG_BINGET x2, TUPLE2, LONG_BINPUT
    return b''.join(ops)


def _memo_size(data: bytes) -> int:
    import pickletools
    return 1 + max((arg for op, arg, _ in pickletools.genops(data) if op.name.endswith('PUT')), default=-1)


def _fc_layer(modules: dict | None = None, parameters: dict | None = None) -> torch.nn.Module:
    """A FullyConnectedLayer whose _modules and _parameters are replaced (they pickle as its state)."""
    from training.networks import stylegan2
    layer = stylegan2.FullyConnectedLayer(in_features=1, out_features=1)
    if modules is not None:
        layer._modules = modules
    if parameters is not None:
        layer._parameters = parameters
    return layer


def _with_kwargs(network: torch.nn.Module, **changes) -> torch.nn.Module:
    import dnnlib
    object.__setattr__(network, 'init_kwargs', dnnlib.EasyDict(network.init_kwargs, **changes))
    return network


def _strided_tensor(storage_elements: int, size: tuple, stride: tuple) -> PickledCall:
    """A float32 tensor pickled as _rebuild_tensor_v2 over a storage of `storage_elements` zeros, any size and stride."""
    storage = PickledCall(torch.storage._load_from_bytes, _legacy_storage('FloatStorage', storage_elements,
                                                                          bytes(4 * storage_elements)))
    return PickledCall(torch._utils._rebuild_tensor_v2, storage, 0, size, stride, False, collections.OrderedDict())


def _pickled_record(opcode: str, meta: dict) -> bytes:
    """{'G': NVIDIA's persistent-object constructor applied to `meta` by NEWOBJ, by OBJ (without arguments) or by INST},
    written opcode by opcode (pickle.dump writes a call as REDUCE)."""
    constructor = b'torch_utils.persistence\n_reconstruct_persistent_obj\n'
    body = pickle.dumps(meta, protocol=2)[2:-1]  # Without PROTO and STOP; its memo indices start at 0, as here.
    record = {'NEWOBJ': b'c' + constructor + body + b'\x85\x81',   # GLOBAL, meta, TUPLE1, NEWOBJ
              'OBJ': b'(c' + constructor + b'o',                    # MARK, GLOBAL, OBJ: the class called without arguments
              'INST': b'(' + body + b'i' + constructor}[opcode]      # MARK, meta, INST
    return b'\x80\x02}X\x01\x00\x00\x00G' + record + b's.'


def nvidia_variants(scale: int = 1 << 20) -> dict[str, tuple[Callable[[], bytes], str]]:
    """name -> (how the file is made, what its refusal must say). `scale` (bytes) sets the long source and the storage
    read many times; the other variants are of fixed size, and each expands (shared dicts, tuples, layers) to far more
    than the bound of any file."""
    source = nvidia_source()
    stylegan3 = nvidia_source(generator_args='mapping_kwargs={}, **synthesis_kwargs')
    meta = dict(type='class', version=6, module_src=source, class_name='Generator', state={})

    def networks(**changes) -> dict:
        result = nvidia_networks()
        result['G'] = result['G_ema'] = _with_kwargs(result['G'], **changes)
        return result

    def long_source() -> bytes:  # Characters beyond the BMP: the str takes 4 bytes a character.
        return nvidia_pickle(nvidia_networks(), source + '#' + '\U0001F600' * (scale // 4) + '\n')

    def many_sources() -> bytes:
        counter = iter(range(1 << 20))
        return nvidia_pickle(nvidia_networks(), lambda module: f'{source}# {next(counter)}\n')

    def storage_read_again() -> bytes:  # One storage blob (memoized), loaded by each of 500 calls.
        blob = _legacy_storage('FloatStorage', scale // 4, bytes(scale))
        result = nvidia_networks()
        for i in range(500):
            result['G'].mapping._buffers[f'copy{i}'] = PickledCall(torch._utils._rebuild_tensor_v2, PickledCall(
                torch.storage._load_from_bytes, blob), 0, (scale // 4,), (1,), False, collections.OrderedDict())
        return nvidia_pickle(result, source)

    def many_layers() -> bytes:  # One layer of width 1 as all 200,000 layers of the mapping network.
        layer = _fc_layer()
        result = networks(mapping_kwargs={'num_layers': 200_000, 'layer_features': 1})
        result['G'].mapping._modules = {f'fc{i}': layer for i in range(200_000)}
        return nvidia_pickle(result, source)

    def huge_label() -> bytes:  # c_dim 10^9 whose embedding [0, c_dim] holds nothing.
        result = networks(c_dim=10 ** 9, mapping_kwargs={'num_layers': 2, 'embed_features': 0})
        result['G'].mapping._modules['embed'] = _fc_layer(parameters={'weight': _strided_tensor(1, (0, 10 ** 9), (0, 0)),
                                                                      'bias': _strided_tensor(1, (0,), (0,))})
        return nvidia_pickle(result, source)

    def layer_dag(depth: int, with_parameters: bool) -> bytes:
        layer = _fc_layer() if with_parameters else _fc_layer(parameters={})
        for _ in range(depth):
            layer = _fc_layer(modules={'a': layer, 'b': layer}, parameters={})
        result = nvidia_networks()
        result['G'].mapping._modules['fc0'] = layer
        return nvidia_pickle(result, source)

    def key_of(key: object) -> bytes:
        return nvidia_pickle({**nvidia_networks(), key: 1}, source)

    def tuple_key() -> bytes:  # The snapshot dict is on the stack before the STOP: key, value, SETITEM.
        prefix = nvidia_pickle(nvidia_networks(), source)
        return prefix[:-1] + _shared_tuples(60, _memo_size(prefix)) + b'K\x01s.'

    def hashed_in_storage() -> bytes:
        f = io.BytesIO()
        for value in (0x1950a86a20f9469cfc6c, 1001):
            pickle.dump(value, f, protocol=2)
        # sys_info: {'little_endian': True, <the tuples>: 1}
        f.write(b'\x80\x02}X\x0d\x00\x00\x00little_endian\x88s' + _shared_tuples(60, 0) + b'K\x01s.')
        result = nvidia_networks()
        result['G'].mapping._buffers['w_avg'] = PickledCall(torch._utils._rebuild_tensor_v2, PickledCall(
            torch.storage._load_from_bytes, f.getvalue()), 0, (8,), (1,), False, collections.OrderedDict())
        return nvidia_pickle(result, source)

    def stylegan3_mapping(value: object) -> bytes:
        result = nvidia_networks()
        G = result['G']
        object.__setattr__(G, 'init_kwargs', dict(z_dim=8, c_dim=0, w_dim=8, img_resolution=8, img_channels=3,
                                                  mapping_kwargs=value, channel_base=128, channel_max=16))
        return nvidia_pickle({'G': G}, stylegan3)

    tuple_visits = 'hashing its dict keys and set items would visit more than 4,194,304 tuples'
    too_large = 'its networks would take more than'
    return {
        'a6u source of 4-byte characters': (long_source, f'holds a string of {scale // 4 * 4 + len(source) + 2:,} bytes'),
        'a7 a source per layer': (many_sources, 'its persistent objects have more than 4 distinct module sources'),
        'b16 G made by NEWOBJ': (lambda: _pickled_record('NEWOBJ', meta), 'is not a pickle that can be read as data '
                                                                           '(UnpicklingError: NEWOBJ class argument must be a type'),
        'b17 G made by OBJ': (lambda: _pickled_record('OBJ', meta), 'calls NVIDIA\'s persistent-object constructor with 0 '
                                                                     'arguments instead of its meta dict'),
        'b17b G made by INST, an extra key': (lambda: _pickled_record('INST', dict(meta, extra=1)),
                                              'a persistent object\'s meta is not a dict of class_name, module_src, state'),
        'c3 a storage read 500 times': (storage_read_again, 'its storages would hold more than the'),
        'c6 10^6 mapping layers of width 1 asked, 2 in the file': (
            lambda: nvidia_pickle(networks(mapping_kwargs={'num_layers': 10 ** 6, 'layer_features': 1}), source),
            'G (training.networks.Generator): training.networks.stylegan2.Generator asks for a network of more than 138 '
            'parameters and buffers, far more than the file holds'),
        'c6c 200,000 mapping layers of width 1': (many_layers, too_large),
        'c7c c_dim 10^9 over an empty embedding': (huge_label, 'G: training.networks.Generator asks for a label dimension '
                                                               '(c_dim) of 1,000,000,000, more than the'),
        'c9 kwargs of shared dicts 22 deep': (lambda: nvidia_pickle(networks(synthesis_kwargs=_shared_dicts(22)), source),
                                              'G.init_kwargs: plain data of more than 10,000 values'),
        'c9b training_set_kwargs of shared dicts 22 deep': (
            lambda: nvidia_pickle(dict(nvidia_networks(), training_set_kwargs=_shared_dicts(22)), source),
            'training_set_kwargs: plain data of more than 10,000 values'),
        'c9d kwargs of shared dicts 29 deep': (lambda: nvidia_pickle(networks(synthesis_kwargs=_shared_dicts(29)), source),
                                               'G.init_kwargs: plain data of more than 10,000 values'),
        'c10 z_dim a list': (lambda: nvidia_pickle(networks(z_dim=[8] * 1000), source),
                             'G.init_kwargs.z_dim is a list, not an integer in [0, 2^31)'),
        'c11 an entry named by bytes': (lambda: key_of(bytes(scale)), 'names an entry by a bytes, not by a string'),
        'c12 a key of shared tuples 60 deep': (tuple_key, tuple_visits),
        'c12b shared tuples 60 deep in a storage': (hashed_in_storage, f'a storage: {tuple_visits}'),
        'c13 layers shared 22 deep, with parameters': (lambda: layer_dag(22, True), too_large),
        'c13c layers shared 30 deep, without parameters': (lambda: layer_dag(30, False), too_large),
        'd5c D as G_ema': (lambda: nvidia_pickle({**nvidia_networks(), 'G_ema': nvidia_networks()['D']}, source),
                           'G_ema is a training.networks.Discriminator, where a Generator belongs'),
        'd10 conv_clamp a string': (lambda: nvidia_pickle(networks(synthesis_kwargs={'channel_base': 128, 'channel_max': 16,
                                                                                      'conv_clamp': '256'}), source),
                                    'G.init_kwargs.synthesis_kwargs.conv_clamp is \'256\', not a number or None'),
        'd11b StyleGAN3 repository mapping_kwargs a string': (lambda: stylegan3_mapping('num_layers=2'),
                                                             'G.init_kwargs.mapping_kwargs is \'num_layers=2\', not a dict'),
        'd11c StyleGAN3 repository mapping_kwargs an integer': (lambda: stylegan3_mapping(2),
                                                               'G.init_kwargs.mapping_kwargs is 2, not a dict'),
    }


def lmdb_with_entry(folder: str, key: bytes = b'b', num_bytes: int = 64 << 10) -> str:
    """An LMDB database in `folder` of one entry of `num_bytes` random bytes (on overflow pages); its data.mdb."""
    import lmdb
    env = lmdb.open(folder, map_size=1 << 24)
    with env.begin(write=True) as txn:
        txn.put(key, os.urandom(num_bytes))
    env.close()
    return os.path.join(folder, 'data.mdb')


def lmdb_claiming(folder: str, claimed_bytes: int, key: bytes = b'b', num_bytes: int = 64 << 10) -> None:
    """An LMDB database in `folder` whose one entry (`num_bytes` on overflow pages) claims `claimed_bytes` (< 4 GiB):
    its leaf node's size (mn_lo, mn_hi: 16 bits each, then flags F_BIGDATA and the key's size) patched."""
    path = lmdb_with_entry(folder, key, num_bytes)
    with open(path, 'r+b') as f:
        raw = f.read()
        node = struct.pack('<HHHH', num_bytes & 0xFFFF, num_bytes >> 16, 1, len(key)) + key
        assert raw.count(node) == 1, 'the leaf node of the entry'
        f.seek(raw.index(node))
        f.write(struct.pack('<HH', claimed_bytes & 0xFFFF, claimed_bytes >> 16))


def lmdb_truncated(folder: str, num_bytes: int = 1 << 20) -> None:
    """An LMDB database in `folder` of one entry of `num_bytes`, cut to its first 64 KiB: the entry's pages are gone."""
    path = lmdb_with_entry(folder, num_bytes=num_bytes)
    with open(path, 'r+b') as f:
        f.truncate(64 << 10)

#----------------------------------------------------------------------------
# Downloads: a server on 127.0.0.1.


class LoopbackServer(http.server.ThreadingHTTPServer):
    """An HTTP server on 127.0.0.1 (an ephemeral port), in a thread while it is entered, that answers GET requests
    by its routes: path -> function of the request handler that writes the whole response. It serves at most
    `max_requests` (then 503) and gives each connection at most `timeout` seconds."""

    def __init__(self, routes: dict, max_requests: int = 8, timeout: float = 5) -> None:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def setup(self) -> None:
                self.timeout = timeout  # StreamRequestHandler: the socket's timeout.
                super().setup()

            def do_GET(self) -> None:
                server.requests.append(self.path)
                if len(server.requests) > max_requests or self.path not in routes:
                    self.send_error(503 if self.path in routes else 404)
                    return
                routes[self.path](self)

            def log_message(self, *args) -> None:
                pass
        self.requests: list[str] = []
        super().__init__(('127.0.0.1', 0), Handler)
        self.daemon_threads = True
        self.thread = threading.Thread(target=self.serve_forever, kwargs=dict(poll_interval=0.05), daemon=True)

    def url(self, path: str) -> str:
        return f'http://127.0.0.1:{self.server_address[1]}{path}'

    def __enter__(self) -> 'LoopbackServer':
        self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join(timeout=5)


def send(body: bytes | int, length: int | None | str = 'true', chunked: bool = False):
    """A route that sends `body` (an int: that many zeros, made a MiB at a time): with the Content-Length header
    `length` ('true': the body's size; None: none, so that the connection's end delimits the body), and in chunked
    transfer encoding if `chunked`. It stops when the client stops reading."""
    size = body if isinstance(body, int) else len(body)

    def route(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.protocol_version = 'HTTP/1.1'
        handler.send_response(200)
        if length is not None:
            handler.send_header('Content-Length', str(size if length == 'true' else length))
        if chunked:
            handler.send_header('Transfer-Encoding', 'chunked')
        handler.send_header('Connection', 'close')
        handler.end_headers()
        piece_size = _CHUNK if isinstance(body, int) else 16 << 10
        try:
            for start in range(0, size, piece_size):
                piece = bytes(min(piece_size, size - start)) if isinstance(body, int) else body[start:start + piece_size]
                handler.wfile.write(b'%x\r\n%s\r\n' % (len(piece), piece) if chunked else piece)
            if chunked:
                handler.wfile.write(b'0\r\n\r\n')
        except (BrokenPipeError, ConnectionResetError):  # The client stopped reading: what a refusal does.
            pass
        handler.close_connection = True
    return route

#----------------------------------------------------------------------------
# Every entry point, run on every kind of hostile file it reads.

DOWNLOAD_CAP = 1 << 20  # $GNGAN_MAX_DOWNLOAD_BYTES of the download case.


@dataclasses.dataclass
class Case:
    entry: str          # The command, as the table shows it.
    file: str           # What is hostile about the file.
    path: str           # The hostile file (a folder: its data.mdb; a URL: the download's cap is its size).
    argv: list[str]     # The script, then its arguments.
    reason: str         # What the refusal's one line must say: why the file is refused.
    env: dict = dataclasses.field(default_factory=dict)  # Environment variables of the command.

    @property
    def file_size(self) -> int:
        """The size that the bound allows for: the file's, or the cap of a download."""
        if '://' in self.path:
            return DOWNLOAD_CAP
        return os.path.getsize(os.path.join(self.path, 'data.mdb') if os.path.isdir(self.path) else self.path)


@dataclasses.dataclass
class Outcome:
    returncode: int
    stderr: str
    peak_rss: int | None  # Bytes: peak resident memory (Linux), None where it cannot be measured.
    seconds: float

    @property
    def last_line(self) -> str:
        lines = self.stderr.strip().splitlines()
        return lines[-1] if lines else ''


def hostile_cases(folder: str, bomb_bytes: int, scripts: tuple[str, ...] | None = None, url: str | None = None,
                  variant_bytes: int = 1 << 20) -> list[Case]:
    """The command lines that read hostile files, one per entry point and file, with the reason each must give;
    only those of `scripts` (default: all). The files are written to `folder` as the cases need them (bombs
    expanding to `bomb_bytes`, the NVIDIA pickle variants' long source and storage of `variant_bytes`); `url` is a
    server's address whose /detector.pt sends more than DOWNLOAD_CAP."""
    made: dict[str, str] = {}

    def made_once(name: str, make) -> str:
        if name not in made:
            path = made[name] = os.path.join(folder, name)
            if name.endswith('_lmdb'):
                os.makedirs(path)
                make(path)
            else:
                with open(path, 'wb') as f:
                    f.write(make())
        return made[name]

    snapshot = lambda: made_once('valid.pkl', snapshot_bytes)  # noqa: E731
    sigma_dim = int((bomb_bytes / 8) ** 0.5)
    bomb = f'{bomb_bytes:,}'
    files = {  # What is hostile about the file: its name, how it is made.
        'snapshot zip bomb': ('bomb.pkl', lambda: snapshot_bomb(bomb_bytes)),
        'snapshot entry claiming more than the file': ('claims.pkl', lambda: oversized_claim(snapshot_bytes(), '/data/0', bomb_bytes)),
        'truncated snapshot': ('truncated.pkl', lambda: truncated(open(snapshot(), 'rb').read())),
        'npz bomb (sigma.npy)': ('bomb.npz', lambda: stats_bomb(2048, sigma_dim)),
        'npz claiming 40000x40000': ('claims.npz', lambda: stats_claiming(40000)),
        'dataset.json bomb': ('json-bomb.zip', lambda: dataset_json_bomb(bomb_bytes)),
        'image entry bomb': ('image-bomb.zip', lambda: image_entry_bomb(bomb_bytes)),
        'detector zip bomb': ('detector-bomb.pt', lambda: zip_bytes([deflate_bomb(e.name, bomb_bytes) if e.name.endswith('/data/0')
                                                                     else e for e in entries_of(detector_bytes())])),
        'detector not TorchScript': ('not-torchscript.pt', lambda: open(snapshot(), 'rb').read()),
        'tar.gz bomb (CIFAR-10 batch)': ('bomb.tar.gz', lambda: tar_gz_bomb('cifar-10-batches-py/data_batch_1', bomb_bytes)),
        'tar member claiming more than the file': ('claims.tar', lambda: tar_claiming('cifar-10-batches-py/data_batch_1', bomb_bytes)),
        f'tar.gz of {bomb_bytes // 512:,} empty members': ('members.tar.gz', lambda: tar_gz_of_empty_members(bomb_bytes // 512)),
        'tar.gz pax header bomb': ('pax-bomb.tar.gz', lambda: tar_gz_pax_bomb(bomb_bytes)),
        'CIFAR-10 batch pickle memo bomb': ('memo-bomb.tar.gz', lambda: cifar_tar_gz({'data_batch_1': memo_bomb_pickle(bomb_bytes)})),
        'CIFAR-10 batch of a Python-object array': ('objects.tar.gz', lambda: cifar_tar_gz({'data_batch_1': object_array_pickle(bomb_bytes // 8)})),
        'LMDB entry claiming more than the file': ('claims_lmdb', lambda path: lmdb_claiming(path, bomb_bytes)),
        'truncated LMDB': ('truncated_lmdb', lmdb_truncated),
        'NVIDIA pickle calling os.system': ('nvidia-system.pkl', lambda: nvidia_pickle_calling_os_system(os.path.join(folder, 'ran'))),
        'NVIDIA pickle whose source runs code': ('nvidia-source.pkl', lambda: nvidia_pickle(nvidia_networks(), (
            f'import pathlib; pathlib.Path({os.path.join(folder, "ran")!r}).write_text("ran")\nclass Generator: pass\n'))),
        'NVIDIA pickle of StyleGAN3 (alias-free)': ('nvidia-stylegan3.pkl', lambda: nvidia_pickle(nvidia_networks(), nvidia_source(
            classes=('SynthesisInput', 'SynthesisLayer', 'SynthesisNetwork', 'MappingNetwork')))),
        'NVIDIA pickle with a storage bomb': ('nvidia-storage-bomb.pkl', lambda: nvidia_storage_bomb(bomb_bytes)),
        'NVIDIA pickle nested 200,000 deep': ('nvidia-deep.pkl', lambda: nvidia_deep_nesting(200_000)),
    }
    detector = lambda: made_once('detector.pt', detector_bytes)  # noqa: E731
    images = lambda: made_once('images.zip', lambda: zip_bytes([stored(f'img{i}.png', png_bytes(i * 50)) for i in range(4)]))  # noqa: E731
    out = os.path.join(folder, 'out')
    cases: list[Case] = []

    def add(entry: str, file: str, reason: str, *args: str, env: dict | None = None) -> None:
        if scripts is not None and entry.split()[0] not in scripts:
            return
        path = url + '/detector.pt' if file == 'download over the cap' else made_once(*files[file])
        cases.append(Case(entry, file, path, [entry.split()[0], *[arg.format(path=path) for arg in args]], reason, env or {}))

    snapshot_reasons = {
        'snapshot zip bomb': 'refused to read: entry archive/data/0 is compressed',
        'snapshot entry claiming more than the file': f'refused to read: entry archive/data/0 claims {bomb_bytes} bytes, more than the file holds',
        'truncated snapshot': 'refused to load: not a snapshot (expected the zip archive that torch.save writes',
    }
    for file, reason in snapshot_reasons.items():
        add('generate.py --network', file, reason, '--network={path}', '--seeds=0', f'--outdir={out}')
        if scripts is None or 'calc_metrics.py' in scripts:
            add('calc_metrics.py --network', file, reason, '--network={path}', '--metrics=is50k', f'--detector={detector()}', '--num-gen=2')
        add('train.py --resume', file, reason, '--resume={path}', f'--outdir={out}', '--kimg=0.001')
        add('legacy.py --source', file, 'not a zip archive (no end of central directory record; truncated?)' if file == 'truncated snapshot'
            else reason, '--source={path}', '--cfg=cifar10-cnn', f'--dest={out}.pkl')
    nvidia_reasons = {  # torch_utils/nvidia_pickle.py; the source and os.system would write or touch <folder>/ran.
        'NVIDIA pickle calling os.system': 'names the global posix.system, which is not read; nothing in it was run',
        'NVIDIA pickle whose source runs code': 'G is a Generator of an unrecognised module source, which is not read',
        'NVIDIA pickle of StyleGAN3 (alias-free)': 'G is a training.networks_stylegan3.Generator, which is not read',
        'NVIDIA pickle with a storage bomb': f'holds a storage that declares {bomb_bytes // 4:,} elements of torch.float32 but '
                                             f'carries 16 bytes',
        'NVIDIA pickle nested 200,000 deep': 'training_set_kwargs: nested deeper than 32 levels',
    }
    for name, (make, reason) in nvidia_variants(variant_bytes).items():
        file = f'NVIDIA pickle {name}'
        files[file] = (f'nvidia-{name.split()[0]}.pkl', make)
        nvidia_reasons[file] = reason
    for file, reason in nvidia_reasons.items():
        add('generate.py --network', file, reason, '--network={path}', '--seeds=0', f'--outdir={out}')
        if scripts is None or 'calc_metrics.py' in scripts:
            add('calc_metrics.py --network', file, reason, '--network={path}', '--metrics=is50k', f'--detector={detector()}', '--num-gen=2')
        add('train.py --resume', file, reason, '--resume={path}', '--cfg=gn-stylegan2', f'--outdir={out}', '--kimg=0.001')
    stats_reasons = {
        'npz bomb (sigma.npy)': f'sigma.npy: refused to read: sigma is [{sigma_dim}, {sigma_dim}], but the statistics are 2048-dimensional',
        'npz claiming 40000x40000': 'sigma.npy: refused to read: sigma is [40000, 40000], but the statistics are 2048-dimensional',
    }
    for file, reason in stats_reasons.items():
        if scripts is None or 'calc_metrics.py' in scripts:
            add('calc_metrics.py --ref-stats', file, reason, f'--images={images()}', '--ref-stats={path}', f'--detector={detector()}',
                '--metrics=fid50k_full')
        add('train.py --ref-stats', file, reason, '--ref-stats={path}', f'--outdir={out}', '--kimg=0.001', '--metrics=fid50k_full')
    for file, tool_reason, train_reason in [
            ('image entry bomb', f'refused to read: entry img0.png expands to {bomb_bytes + len(png_bytes(0)):,} bytes', None),
            ('dataset.json bomb', f'is {bomb_bytes + 16:,} bytes; labels of its 2 images take at most', None)]:
        add('train.py --data', file, train_reason or tool_reason, '--data={path}', f'--outdir={out}', '--kimg=0.001')
        add('dataset_tool.py --source', file, tool_reason, '--source={path}', f'--dest={out}-{len(cases)}.zip')
    if scripts is None or 'calc_metrics.py' in scripts:
        add('calc_metrics.py --images', 'image entry bomb', f'refused to read: entry img0.png expands to {bomb_bytes + len(png_bytes(0)):,} bytes',
            '--images={path}', f'--detector={detector()}', '--metrics=is50k', '--num-gen=2')
        for file, reason in [('detector zip bomb', 'refused to read: entry detector/data/0 is compressed'),
                             ('detector not TorchScript', 'is not TorchScript (no constants.pkl: written by torch.save, not torch.jit.save)')]:
            add('calc_metrics.py --detector', file, reason, f'--images={images()}', '--detector={path}', '--metrics=is50k', '--num-gen=4')
        if url is not None:
            add('calc_metrics.py --detector', 'download over the cap', f'it is larger than the cap of {DOWNLOAD_CAP:,} bytes',
                f'--images={images()}', '--detector={path}', '--metrics=is50k', '--num-gen=4',
                env=dict(GNGAN_MAX_DOWNLOAD_BYTES=str(DOWNLOAD_CAP)))
    tar_claim = f'refused to read: member cifar-10-batches-py/data_batch_1 claims {bomb} bytes, more than the archive can hold'
    for file, reason in [
            ('tar.gz bomb (CIFAR-10 batch)', tar_claim), ('tar member claiming more than the file', tar_claim),
            (f'tar.gz of {bomb_bytes // 512:,} empty members', f'refused to read: it lists more than 1,024 members'),
            ('tar.gz pax header bomb', 'refused to read: a member\'s headers take more than 65,536 bytes'),
            ('CIFAR-10 batch pickle memo bomb', f'refused to read: the pickle stores memo entry {bomb_bytes // 16} after 0'),
            ('CIFAR-10 batch of a Python-object array', 'refusing an array that is not plain data of its declared size'),
            ('LMDB entry claiming more than the file', f'refused to read: entry b claims {bomb} bytes at byte'),
            ('truncated LMDB', 'refused to read: its pages reach byte 1,064,960 of data.mdb, which holds 65,536 (truncated?)')]:
        if 'LMDB' in file and importlib.util.find_spec('lmdb') is None:
            continue  # The tests write the databases with the lmdb package; the tool reads them without.
        add('dataset_tool.py --source', file, reason, '--source={path}', f'--dest={out}-{len(cases)}.zip')
    return cases


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _environment(cwd: str, case_env: dict, repo: str) -> dict:
    """The environment of an entry point's process: `repo` importable, the CPU, a cache of its own."""
    return dict(os.environ, CUDA_VISIBLE_DEVICES='', PYTHONPATH=repo, GNGAN_CACHE_DIR=os.path.join(cwd, 'cache'), **case_env)


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


def run_cli(argv: list[str], cwd: str, env: dict | None = None, repo: str = REPO) -> Outcome:
    """Run `python <argv>` (a script of `repo`, this repository by default, and its arguments) on the CPU
    (CUDA_VISIBLE_DEVICES='') and measure that process alone: exit code, stderr, peak resident memory, wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        peak_file = os.path.join(tmp, 'peak')
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, '-S', '-c', _MEASURE, peak_file, os.path.join(repo, argv[0]), *argv[1:]],
                              cwd=cwd, env=_environment(cwd, env or {}, repo), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        seconds = time.perf_counter() - start
        with open(peak_file) as f:
            peak_kib = int(f.read())
    return Outcome(proc.returncode, proc.stderr.decode(errors='replace'), peak_kib * 1024, seconds)


# Imports one entry point's script, then runs its click command on each case in turn, in this process: its
# stdout and stderr (file descriptors 1 and 2) sent to files, and its peak resident memory (Linux: VmHWM)
# read after each case, from the level where it started (writing 5 to /proc/self/clear_refs resets the peak).
_RUN_CASES = r"""import importlib, json, os, re, sys, time, traceback
spec_file, results_file = sys.argv[1:]
with open(spec_file) as f:
    spec = json.load(f)

def peak_rss():
    try:
        with open('/proc/self/status') as f:
            return int(re.search(r'VmHWM:\s+(\d+) kB', f.read()).group(1)) << 10
    except (OSError, AttributeError):
        return None

script = spec['script']
sys.argv = [script]
main = importlib.import_module(script[:-len('.py')]).main
results = dict(footprint=peak_rss(), outcomes=[])
console = os.dup(1), os.dup(2)
for case in spec['cases']:
    os.environ.update(case['env'])
    with open(os.devnull, 'wb') as out, open(case['stderr'], 'wb') as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            with open('/proc/self/clear_refs', 'w') as f:
                f.write('5')
        except OSError:
            pass
        start = time.perf_counter()
        try:
            main.main(args=case['args'], prog_name=script, standalone_mode=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        seconds = time.perf_counter() - start
        os.dup2(console[0], 1)
        os.dup2(console[1], 2)
    for name in case['env']:
        del os.environ[name]
    with open(case['stderr'], encoding='utf-8', errors='replace') as f:
        results['outcomes'].append(dict(returncode=code, stderr=f.read(), peak_rss=peak_rss(), seconds=seconds))
with open(results_file, 'w') as f:
    json.dump(results, f)
"""


def run_entry_point(script: str, cases: list[Case], cwd: str) -> tuple[int | None, list[Outcome]]:
    """Run `script`'s cases in one process of their own, on the CPU: (that process's footprint after importing the
    script, and for each case its exit code, stderr, peak resident memory and wall time). Where it cannot be
    measured (not Linux), the memory is None."""
    assert all(case.argv[0] == script for case in cases)
    with tempfile.TemporaryDirectory() as tmp:
        spec = dict(script=script, cases=[dict(args=case.argv[1:], env=case.env, stderr=os.path.join(tmp, f'{i}.err'))
                                          for i, case in enumerate(cases)])
        with open(os.path.join(tmp, 'spec.json'), 'w') as f:
            json.dump(spec, f)
        proc = subprocess.run([sys.executable, '-c', _RUN_CASES, os.path.join(tmp, 'spec.json'), os.path.join(tmp, 'results.json')],
                              cwd=cwd, env=_environment(cwd, {}, REPO), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f'{script}: the cases\' process ended with {proc.returncode}: {proc.stderr.decode(errors="replace")[-2000:]}')
        with open(os.path.join(tmp, 'results.json')) as f:
            results = json.load(f)
    return results['footprint'], [Outcome(**outcome) for outcome in results['outcomes']]

#----------------------------------------------------------------------------

main = module_command(__doc__, 'python -m bench.hostile_files')

if __name__ == '__main__':
    main()
