"""Files from outside, read within a stated memory bound: zip archives checked before anything in them
is decompressed or unpickled.

Snapshots, the authors' checkpoints, TorchScript detectors (all written by torch.save or torch.jit.save),
reference statistics (.npz) and dataset zips are zip archives, and travel between people. A zip holds a
central directory that declares every entry's sizes and compression; the deflate format expands up to
1032:1, so a file of a few MB can declare, and inflate to, gigabytes. Every reader of such a file opens it
through `ZipArchive`, which reads the end record and the central directory only, and refuses with
`RefusedFileError` (one line, naming the file) what could not be read within the bound:

    peak memory <= MEMORY_FACTOR * file size + MEMORY_ALLOWANCE   (above the process's own footprint)

It does so by refusing, before decompressing anything:

* an end record or central directory that is not within the file, or that holds fewer bytes than its
  entries need (truncated or damaged archives);
* an entry whose data would lie beyond the start of the central directory (it claims more bytes than
  the file holds), or that is compressed with anything but deflate;
* in torch's archives (`torch_format`: torch.save, torch.jit.save), any compressed entry but TorchScript
  source (code/, which torch.jit.save deflates; tensors and pickles are stored), entries whose sizes
  add up to more than the file's size + ENTRY_ALLOWANCE (torch reads every entry it needs whole), and
  a pickle (data.pkl, constants.pkl) of more than MAX_PICKLE_BYTES;
* when an entry is read, one that declares more than the file's size + ENTRY_ALLOWANCE uncompressed
  (zipfile never returns more than an entry declares);
* an .npy entry (`read_npy`) whose header (shape, dtype) the caller does not accept, or whose declared
  size is not exactly header + data: the data is read only after that.

What the loaders build from the bytes (networks from tensors, Python objects from JSON) is bounded by
their own checks; each is documented where it is made (persistence.py, frechet_inception_distance.py,
training/data/dataset.py). Decoding an image is bounded by Pillow's pixel limit (PIL.Image.MAX_IMAGE_PIXELS).
"""

from __future__ import annotations

import math
import os
import struct
import zipfile
import zlib
from typing import IO, BinaryIO, Callable

import numpy as np

import dnnlib

MEMORY_FACTOR = 4                # Peak memory of reading a file, per byte of the file ...
MEMORY_ALLOWANCE = 256 << 20     # ... plus this (what lazily imported modules and reference statistics take).
ENTRY_ALLOWANCE = 64 << 20       # A decompressed entry may exceed the size of its archive by at most this.
# The largest pickle read from torch's archives (data.pkl, constants.pkl). Unpickling makes up to ~36 bytes of
# objects per byte (an empty list and its append, 2 bytes: 7.6 MiB became 275 MiB in torch's weights-only
# unpickler), so 4 MiB stay within MEMORY_ALLOWANCE; a real snapshot's object graph is well under 1 MiB.
MAX_PICKLE_BYTES = 4 << 20
_READ_CHUNK = 1 << 20            # Entries are copied into their arrays this many bytes at a time.

# Zip format (PKWARE APPNOTE 6.3): the end of central directory record (22 bytes + comment), the zip64 end
# record locator (20 bytes, just before it) and the zip64 end record; a central directory header is 46 bytes
# plus its name, extra field and comment; a local file header is 30 bytes plus its name and extra field.
_END = struct.Struct('<4s4H2LH')        # signature, disk numbers (2), entries on this disk / in all, size, offset, comment length
_END_SIGNATURE = b'PK\x05\x06'
_ZIP64_LOCATOR = struct.Struct('<4sLQL')  # signature, disk of the zip64 end record, its offset, number of disks
_ZIP64_LOCATOR_SIGNATURE = b'PK\x06\x07'
_ZIP64_END = struct.Struct('<4sQ2H2L4Q')  # signature, record size, versions (2), disks (2), entries (2), size, offset
_ZIP64_END_SIGNATURE = b'PK\x06\x06'
_CENTRAL_HEADER_SIZE = 46
_LOCAL_HEADER_SIZE = 30
_MAX_COMMENT = 0xFFFF


class RefusedFileError(ValueError):
    """A file from outside that is refused before it is read: it could not be read within the bound, or is
    not the archive it should be. The message is one line that names the file and says why."""


def _end_record(f: BinaryIO, file_size: int, name: str) -> tuple[int, int, int, int]:
    """(entries, central directory size, its offset, where the end records begin), from the end records alone."""
    tail_size = min(file_size, _END.size + _MAX_COMMENT)
    f.seek(file_size - tail_size)
    tail = f.read(tail_size)
    at = tail.rfind(_END_SIGNATURE)
    if at < 0 or len(tail) - at < _END.size:
        raise RefusedFileError(f'{name}: not a zip archive (no end of central directory record; truncated?)')
    _sig, _disk, _disk_cd, _entries_here, entries, cd_size, cd_offset, _comment = _END.unpack_from(tail, at)
    end_start = file_size - tail_size + at
    locator_at = at - _ZIP64_LOCATOR.size
    if locator_at >= 0 and tail[locator_at:locator_at + 4] == _ZIP64_LOCATOR_SIGNATURE:
        _sig, _disk, zip64_offset, _disks = _ZIP64_LOCATOR.unpack_from(tail, locator_at)
        if zip64_offset + _ZIP64_END.size > file_size - tail_size + locator_at:
            raise RefusedFileError(f'{name}: damaged zip archive (its zip64 end record lies outside the file)')
        f.seek(zip64_offset)
        record = f.read(_ZIP64_END.size)
        if record[:4] != _ZIP64_END_SIGNATURE:
            raise RefusedFileError(f'{name}: damaged zip archive (no zip64 end record where its locator points)')
        _sig, _size, _made, _needed, _disk, _disk_cd, _entries_here, entries, cd_size, cd_offset = _ZIP64_END.unpack(record)
        end_start = zip64_offset
    return entries, cd_size, cd_offset, end_start


class ZipArchive:
    """A zip archive from outside (a path, or a seekable file object), its central directory checked when
    it is opened (see the module docstring); its entries are then read within the bound. `name` names the
    file in messages (default: the path).

    `torch_format`: the archive is torch's (torch.save, torch.jit.save), which torch then reads itself.
    """

    def __init__(self, file: BinaryIO | str, name: str | None = None, torch_format: bool = False) -> None:
        self.name = name if name is not None else str(file)
        self.zip: zipfile.ZipFile | None = None
        self._owned_file = open(file, 'rb') if isinstance(file, str) else None  # Closed by close().
        try:
            self._check(self._owned_file or file, torch_format)
        except BaseException:
            self.close()
            raise

    def _check(self, file: BinaryIO, torch_format: bool) -> None:
        name = self.name
        file.seek(0, os.SEEK_END)
        self.file_size = file.tell()
        entries, cd_size, cd_offset, end_start = _end_record(file, self.file_size, name)
        if cd_offset + cd_size > end_start or entries * _CENTRAL_HEADER_SIZE > cd_size:
            raise RefusedFileError(f'{name}: damaged zip archive (its central directory of {entries} entries, {cd_size} '
                                   f'bytes at offset {cd_offset}, does not fit in the {self.file_size} bytes of the file)')
        file.seek(0)
        try:
            self.zip = zipfile.ZipFile(file)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as e:
            raise RefusedFileError(f'{name}: damaged zip archive ({e})') from None
        self.entries = {info.filename: info for info in self.zip.infolist()}
        if len(self.entries) != entries:
            raise RefusedFileError(f'{name}: damaged zip archive (its end record counts {entries} entries, its directory '
                                   f'{len(self.entries)} distinct ones)')
        for info in self.entries.values():
            self._check_entry(info, self.zip.start_dir, torch_format)
        if torch_format and sum(info.file_size for info in self.entries.values()) > self.max_entry_size():
            raise RefusedFileError(f'{name}: refused to read: its entries claim more bytes than the file holds')
        for info in self.entries.values() if torch_format else ():
            if info.filename.endswith('.pkl') and info.file_size > MAX_PICKLE_BYTES:
                raise RefusedFileError(f'{name}: refused to read: its pickle {info.filename[:100]} is {info.file_size:,} bytes '
                                       f'(at most {MAX_PICKLE_BYTES:,} are unpickled)')
        file.seek(0)

    def _check_entry(self, info: zipfile.ZipInfo, directory_start: int, torch_format: bool) -> None:
        what = f'{self.name}: refused to read: entry {info.filename[:100]}'
        # Its local header and data must lie before the central directory (header offsets as zipfile has
        # corrected them for bytes prepended to the archive).
        if info.header_offset + _LOCAL_HEADER_SIZE + len(info.orig_filename.encode()) + info.compress_size > directory_start:
            raise RefusedFileError(f'{what} claims {info.compress_size} bytes, more than the file holds')
        if torch_format and info.compress_type != zipfile.ZIP_STORED and '/code/' not in info.filename:
            raise RefusedFileError(f'{what} is compressed ({info.compress_size} bytes that expand to {info.file_size}); '
                                   f'torch.save and torch.jit.save store tensors and pickles uncompressed')
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise RefusedFileError(f'{what} uses compression method {info.compress_type}; only stored and deflated entries are read')
        if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
            raise RefusedFileError(f'{what} is stored as {info.compress_size} bytes but claims {info.file_size}')

    def close(self) -> None:
        """Close the archive, and the file when it was opened here from a path."""
        if self.zip is not None:
            self.zip.close()
        if self._owned_file is not None:
            self._owned_file.close()

    def __enter__(self) -> ZipArchive:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def max_entry_size(self) -> int:
        """The most bytes an entry may expand to: the file's size + ENTRY_ALLOWANCE."""
        return self.file_size + ENTRY_ALLOWANCE

    def open(self, entry: str) -> IO[bytes]:
        """A file object of one entry, refused before decompression when it declares more than max_entry_size()."""
        info = self.entries.get(entry)
        if info is None:
            raise RefusedFileError(f'{self.name}: no entry {entry[:100]}')
        if info.file_size > self.max_entry_size():
            raise RefusedFileError(f'{self.name}: refused to read: entry {entry[:100]} expands to {info.file_size:,} bytes, '
                                   f'more than the file\'s {self.file_size:,} + {ENTRY_ALLOWANCE >> 20} MiB')
        return self.zip.open(info)

    def read(self, entry: str) -> bytes:
        """The bytes of one entry (see open()); RefusedFileError when they are damaged."""
        with self.open(entry) as f:
            try:
                return f.read()
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
                raise RefusedFileError(f'{self.name}: damaged entry {entry[:100]} ({e})') from None

    def read_npy(self, entry: str, accept: Callable[[tuple[int, ...], np.dtype], str | None]) -> np.ndarray:
        """The array of an .npy entry, read only after its header: `accept(shape, dtype)` returns None for an
        array to read, or why not (refused with that reason). The entry may be compressed to any ratio, since
        its declared size must be exactly that of the header and the accepted array: nothing more is inflated."""
        info = self.entries.get(entry)
        if info is None:
            raise RefusedFileError(f'{self.name}: no entry {entry[:100]}')
        what = f'{self.name}: {entry[:100]}'
        with self.zip.open(info) as f:
            try:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(f)
                elif version == (2, 0):
                    shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(f)
                else:
                    raise ValueError(f'.npy format version {version[0]}.{version[1]} is not read')
            except (ValueError, zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
                raise RefusedFileError(f'{what}: not an .npy array ({dnnlib.util.first_line(e, 200)})') from None
            reason = 'it holds Python objects' if dtype.hasobject else accept(shape, dtype)
            if reason is not None:
                raise RefusedFileError(f'{what}: refused to read: {reason}')
            num_bytes = math.prod(shape) * dtype.itemsize
            if info.file_size != f.tell() + num_bytes:
                raise RefusedFileError(f'{what}: refused to read: the entry declares {info.file_size} bytes, its header '
                                       f'{f.tell()} + {num_bytes} for a {dtype} array of shape {list(shape)}')
            data = np.empty(num_bytes, dtype=np.uint8)
            try:
                for start in range(0, num_bytes, _READ_CHUNK):
                    chunk = f.read(min(_READ_CHUNK, num_bytes - start))
                    if len(chunk) != min(_READ_CHUNK, num_bytes - start):
                        raise EOFError('the data ends early')
                    data[start:start + len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
                f.read(1)  # At the declared end: zipfile checks the entry's CRC.
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
                raise RefusedFileError(f'{what}: damaged entry ({e})') from None
        return data.view(dtype).reshape(shape, order='F' if fortran_order else 'C')


def check_torch_archive(file: BinaryIO, name: str) -> ZipArchive:
    """Refuse (RefusedFileError) a file that torch.load or torch.jit.load could not read within the bound:
    anything but a zip archive as torch writes them (tensors and pickles stored, TorchScript source
    deflated) whose entries fit in the file. Returns the checked archive (its directory) and leaves `file`
    at its start, for torch to read."""
    return ZipArchive(file, name, torch_format=True)
