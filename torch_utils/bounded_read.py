"""Files from outside, read within a stated memory bound: zip archives checked before anything in them
is decompressed or unpickled; tar archives, pickles and LMDB databases likewise.

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

dataset_tool's other archives are read within the same bound: tar archives (CIFAR-10's and STL-10's, plain or
compressed) through `TarArchive` (a member that claims to reach beyond what the file may expand to, too many
members, oversized headers, and members read whole beyond the file's size + ENTRY_ALLOWANCE are refused), the
pickles in them after `check_pickle`, and LSUN's LMDB databases through `LmdbDatabase`, which reads data.mdb
itself, checking every page and value against the file before it is read.

What the loaders build from the bytes (networks from tensors, Python objects from JSON) is bounded by
their own checks; each is documented where it is made (persistence.py, frechet_inception_distance.py,
training/data/dataset.py). Decoding an image is bounded by Pillow's pixel limit (PIL.Image.MAX_IMAGE_PIXELS).
"""

from __future__ import annotations

import math
import os
import struct
import tarfile
import zipfile
import zlib
from typing import IO, BinaryIO, Callable, Iterator

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
# Tar archives (TarArchive). A compressed tar expands to at most TAR_EXPANSION x its size + ENTRY_ALLOWANCE (the
# datasets' archives: 1.1x; a gzip bomb: up to ~1000x); tarfile keeps the header of every member listed, and reads
# each member's headers (pax and GNU long-name records, sparse maps) whole.
TAR_EXPANSION = 4
MAX_TAR_MEMBERS = 1024           # CIFAR-10's and STL-10's archives hold a dozen.
MAX_TAR_HEADER_BYTES = 64 << 10  # A member's headers: 512 bytes, and a few hundred more with pax records.
# The most opcodes of a pickle that Python's unpickler loads (check_pickle): each makes at most one object of at
# most ~120 bytes (an empty set and its place in a list) beside the bytes it carries; a CIFAR-10 batch has ~40,000.
MAX_PICKLE_OPCODES = 1 << 20

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


#----------------------------------------------------------------------------
# Tar archives (dataset_tool's CIFAR-10 and STL-10 sources).


class _Refused(Exception):
    """Why a tar archive is refused, raised where its name is not known; TarArchive adds the name."""


class _TarStream:
    """The tar stream, decompressed, as tarfile reads it: its position may not pass `max_size` (a bomb is refused
    when it expands beyond; a seek beyond, before its bytes are skipped), and outside member data (`in_data` False)
    the reads for one member's headers (tar header, pax and GNU long-name records, sparse maps, which tarfile
    reads whole) add up to at most MAX_TAR_HEADER_BYTES."""

    def __init__(self, stream: BinaryIO, name: str, max_size: int, expansion: str) -> None:
        self.stream, self.name, self.max_size, self.expansion = stream, name, max_size, expansion
        self.header_bytes = 0
        self.in_data = False

    def _check_position(self, position: int) -> None:
        if position > self.max_size:
            raise _Refused(f'it expands to more than {self.max_size:,} bytes ({self.expansion})')

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            raise _Refused('a read of the whole rest of the archive')  # Never asked by tarfile or TarArchive.
        if not self.in_data:
            self.header_bytes += size
            if self.header_bytes > MAX_TAR_HEADER_BYTES:
                raise _Refused(f'a member\'s headers take more than {MAX_TAR_HEADER_BYTES:,} bytes')
        data = self.stream.read(size)
        self._check_position(self.stream.tell())
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence != os.SEEK_SET:
            raise _Refused('a seek from the end or the current position')  # Never asked by tarfile.
        self._check_position(offset)
        return self.stream.seek(offset)

    def tell(self) -> int:
        return self.stream.tell()


class TarArchive:
    """A tar archive from outside, plain or compressed (gzip, bzip2, xz), read within the bound:

    * its tar stream may expand to at most the file's size when plain, TAR_EXPANSION x the file's size +
      ENTRY_ALLOWANCE when compressed (the datasets' archives expand by 1.1x; a tar.gz bomb by up to 1000x): a
      member that claims to end beyond is refused when it is listed, before any of it is read or skipped;
    * at most MAX_TAR_MEMBERS members are listed (tarfile keeps each one's header), and each one's headers take at
      most MAX_TAR_HEADER_BYTES;
    * a member read whole (read()) may hold at most the file's size + ENTRY_ALLOWANCE, and all such members
      together as much; a larger one is read in pieces of the caller's size (open()).

    A file that is not a tar archive raises NotATarArchive; one refused or damaged, RefusedFileError (one line
    naming the file)."""

    def __init__(self, path: str) -> None:
        self.name = path
        self.file_size = os.path.getsize(path)
        self._file = open(path, 'rb')
        self.read_bytes = 0  # What read() has returned so far.
        try:
            magic = self._file.read(6)
            self._file.seek(0)
            self._decompressed = decompressed = _decompressor(magic, self._file)
            if decompressed is None:
                max_size, expansion = self.file_size, 'a tar archive holds no more than its file'
            else:
                max_size = TAR_EXPANSION * self.file_size + ENTRY_ALLOWANCE
                expansion = f'{TAR_EXPANSION}x the file\'s {self.file_size:,} + {ENTRY_ALLOWANCE >> 20} MiB'
            self._stream = _TarStream(decompressed or self._file, path, max_size, expansion)
            try:
                self.tar = tarfile.TarFile(fileobj=self._stream, mode='r')  # Reads the first member's headers.
            except _Refused as e:
                raise RefusedFileError(f'{path}: refused to read: {e}') from None
            except (tarfile.TarError, OSError, EOFError, zlib.error, ValueError) as e:  # lzma.LZMAError is an OSError.
                raise NotATarArchive(f'{path}: not a tar archive ({dnnlib.util.first_line(e, 200)})') from None
        except BaseException:
            self._file.close()
            raise

    def _refusal(self, error: BaseException) -> RefusedFileError:
        if isinstance(error, _Refused):
            return RefusedFileError(f'{self.name}: refused to read: {error}')
        return RefusedFileError(f'{self.name}: damaged tar archive ({dnnlib.util.first_line(error, 200)})')

    def max_entry_size(self) -> int:
        """The most bytes read() returns, of one member and of all together: the file's size + ENTRY_ALLOWANCE."""
        return self.file_size + ENTRY_ALLOWANCE

    def members(self) -> Iterator[tarfile.TarInfo]:
        """The archive's members in order, each checked when it is listed (see the class docstring)."""
        count = 0
        iterator = iter(self.tar)
        while True:
            try:
                member = next(iterator, None)
            except (_Refused, tarfile.TarError, OSError, EOFError, zlib.error, ValueError, RecursionError) as e:
                raise self._refusal(e) from None
            if member is None:
                return
            count += 1
            if count > MAX_TAR_MEMBERS:
                raise RefusedFileError(f'{self.name}: refused to read: it lists more than {MAX_TAR_MEMBERS:,} members')
            if member.offset_data + member.size > self._stream.max_size:
                raise RefusedFileError(f'{self.name}: refused to read: member {member.name[:100]} claims {member.size:,} '
                                       f'bytes, more than the archive can hold ({self._stream.expansion})')
            self._stream.header_bytes = 0
            yield member

    def open(self, member: tarfile.TarInfo) -> '_TarMemberFile':
        """A member's data as a file object, read in pieces of the caller's size."""
        return _TarMemberFile(self, member)

    def read(self, member: tarfile.TarInfo) -> bytes:
        """A member's data whole, refused when it, or it and the members read before, exceed max_entry_size()."""
        if self.read_bytes + member.size > self.max_entry_size():
            before = f', which with the {self.read_bytes:,} read before is' if self.read_bytes else ','
            raise RefusedFileError(f'{self.name}: refused to read: member {member.name[:100]} is {member.size:,} bytes{before} '
                                   f'more than the file\'s {self.file_size:,} + {ENTRY_ALLOWANCE >> 20} MiB')
        data = self.open(member).read(member.size)
        if len(data) != member.size:
            raise RefusedFileError(f'{self.name}: damaged tar archive (member {member.name[:100]} ends early)')
        self.read_bytes += member.size
        return data

    def close(self) -> None:
        self.tar.close()
        if self._decompressed is not None:
            self._decompressed.close()
        self._file.close()

    def __enter__(self) -> TarArchive:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _TarMemberFile:
    """One member's data (TarArchive.open): reads of a given size, errors as RefusedFileError naming the archive."""

    def __init__(self, archive: TarArchive, member: tarfile.TarInfo) -> None:
        self.archive = archive
        self.file = archive.tar.extractfile(member)
        if self.file is None:
            raise RefusedFileError(f'{archive.name}: member {member.name[:100]} is not a file')

    def read(self, size: int) -> bytes:
        stream = self.archive._stream  # pylint: disable=protected-access
        stream.in_data = True
        try:
            return self.file.read(size)
        except (_Refused, tarfile.TarError, OSError, EOFError, zlib.error, ValueError) as e:
            raise self.archive._refusal(e) from None  # pylint: disable=protected-access
        finally:
            stream.in_data = False


class NotATarArchive(RefusedFileError):
    """A file that is no tar archive, plain or compressed."""


def _decompressor(magic: bytes, file: BinaryIO) -> BinaryIO | None:
    """The decompressed stream of a gzip, bzip2 or xz file (by its first bytes); None for anything else."""
    if magic.startswith(b'\x1f\x8b'):
        import gzip
        return gzip.GzipFile(fileobj=file, mode='rb')
    if magic.startswith(b'BZh'):
        import bz2
        return bz2.BZ2File(file)
    if magic.startswith(b'\xfd7zXZ\x00'):
        import lzma
        return lzma.LZMAFile(file)
    return None

#----------------------------------------------------------------------------
# Pickles read by Python's unpickler (CIFAR-10's batches).


def check_pickle(data: bytes | BinaryIO, name: str, max_opcodes: int | None = None) -> None:
    """Refuse (RefusedFileError) a pickle (its bytes, or a file from its position to the pickle's STOP) that Python's
    unpickler could not load within the bound, before it is loaded: one of more than `max_opcodes` opcodes (each
    makes at most one object, of at most ~120 bytes beside the bytes it carries), or whose memo indices skip ahead
    (the C unpickler grows its memo array to twice the largest index: one opcode of 5 bytes would take 32 GiB);
    `max_opcodes` None: MAX_PICKLE_OPCODES. What the opcodes may build is the unpickler's find_class to restrict."""
    import pickletools
    max_opcodes = MAX_PICKLE_OPCODES if max_opcodes is None else max_opcodes
    memo_size, opcodes = 0, pickletools.genops(data)
    for count in range(max_opcodes + 1):
        try:
            opcode, arg, _pos = next(opcodes)
        except StopIteration:
            return
        except ValueError as e:  # pickletools: an unknown opcode, an argument beyond the data, no STOP.
            raise RefusedFileError(f'{name}: not a pickle ({dnnlib.util.first_line(e, 200)})') from None
        if count == max_opcodes:
            raise RefusedFileError(f'{name}: refused to read: a pickle of more than {max_opcodes:,} opcodes')
        if opcode.name in ('PUT', 'BINPUT', 'LONG_BINPUT'):
            if not isinstance(arg, int) or arg > memo_size:
                raise RefusedFileError(f'{name}: refused to read: the pickle stores memo entry {str(arg)[:20]} after {memo_size}')
            memo_size = max(memo_size, arg + 1)
        elif opcode.name == 'MEMOIZE':
            memo_size += 1

#----------------------------------------------------------------------------
# LMDB databases (dataset_tool's LSUN sources).
#
# The lmdb package maps data.mdb into memory and touches every page of a value when a cursor reaches it, so a
# value that claims to reach beyond the file's end kills the process (SIGBUS) before its size can be looked at.
# So the database is read here from the file, as LMDB lays it out (LMDB 0.9, data version 1, 64-bit little-endian,
# as LSUN's databases are): two meta pages, then pages of psize bytes, each with a 16-byte header (page number,
# padding, flags, and the ends of its node offsets and of its free space, or for an overflow page the number of
# pages); the main database is a B+ tree whose branch nodes point to pages and whose leaf nodes hold a key and
# a value, or the number of the first of the overflow pages that hold the value.

_LMDB_MAGIC, _LMDB_VERSION = 0xBEEFC0DE, 1
_LMDB_PAGE = struct.Struct('<QHHHH')      # page number, padding, flags, lower (end of node offsets), upper
_LMDB_OVERFLOW = struct.Struct('<QHHI')   # page number, padding, flags, number of pages
_LMDB_META = struct.Struct('<IIQQ')       # magic, version, map address, map size
_LMDB_DB = struct.Struct('<IHHQQQQQ')     # page size (free DB) or padding, flags, depth, branch, leaf and overflow pages, entries, root
_LMDB_META_TAIL = struct.Struct('<QQ')    # last page used, transaction id
_LMDB_NODE = struct.Struct('<HHHH')       # low and high 16 bits of the value size (leaf) or page number (branch); flags; key size
_P_BRANCH, _P_LEAF, _P_OVERFLOW = 0x01, 0x02, 0x04
_F_BIGDATA = 0x01                         # Leaf node flags: the value lies on overflow pages; others: sub-databases, duplicates.
_LMDB_NO_PAGE = 0xFFFFFFFFFFFFFFFF        # The root of an empty database.
_LMDB_MAX_DEPTH = 64


class LmdbDatabase:
    """An LMDB database from outside (the folder that holds data.mdb), read from its file within the bound: its
    meta page, and every page of its tree before that page is used, must lie within the file, and a value is
    read (one at a time, by entries()) only when it lies within the file too. RefusedFileError (one line naming
    the database) otherwise."""

    def __init__(self, path: str) -> None:
        self.name = path
        self._file = open(os.path.join(path, 'data.mdb'), 'rb')
        try:
            self.file_size = os.fstat(self._file.fileno()).st_size
            self._read_meta()
        except BaseException:
            self._file.close()
            raise

    def _refused(self, why: str) -> RefusedFileError:
        return RefusedFileError(f'{self.name}: refused to read: {why}')

    def _read(self, offset: int, size: int, what: str) -> bytes:
        if offset + size > self.file_size:
            raise self._refused(f'{what} lies beyond the {self.file_size:,} bytes of data.mdb (truncated?)')
        self._file.seek(offset)
        return self._file.read(size)

    def _read_meta(self) -> None:
        metas = []
        meta_size = _LMDB_PAGE.size + _LMDB_META.size + 2 * _LMDB_DB.size + _LMDB_META_TAIL.size
        for index in range(2):
            offset = 0 if index == 0 else metas[0][0]
            raw = self._read(offset, meta_size, f'meta page {index}')
            magic, version, _address, _map_size = _LMDB_META.unpack_from(raw, _LMDB_PAGE.size)
            if magic != _LMDB_MAGIC:
                raise RefusedFileError(f'{self.name}: not an LMDB database (no LMDB meta page at offset {offset})')
            if version != _LMDB_VERSION:
                raise RefusedFileError(f'{self.name}: LMDB data version {version} is not read (only {_LMDB_VERSION})')
            free_db = _LMDB_DB.unpack_from(raw, _LMDB_PAGE.size + _LMDB_META.size)
            main_db = _LMDB_DB.unpack_from(raw, _LMDB_PAGE.size + _LMDB_META.size + _LMDB_DB.size)
            last_page, txn_id = _LMDB_META_TAIL.unpack_from(raw, meta_size - _LMDB_META_TAIL.size)
            metas.append((free_db[0], main_db, last_page, txn_id))
        self.page_size, (_pad, flags, self.depth, *_pages, self.num_entries, self.root), last_page, _txn = \
            max(metas, key=lambda meta: meta[3])
        if self.page_size < 512 or self.page_size & (self.page_size - 1) or self.page_size != metas[0][0]:
            raise RefusedFileError(f'{self.name}: damaged LMDB database (page size {self.page_size})')
        if flags != 0:
            raise self._refused(f'its main database has flags {flags:#x} (sub-databases or duplicate keys, which LSUN\'s have not)')
        if (last_page + 1) * self.page_size > self.file_size:
            raise self._refused(f'its pages reach byte {(last_page + 1) * self.page_size:,} of data.mdb, which holds '
                                f'{self.file_size:,} (truncated?)')
        if self.depth > _LMDB_MAX_DEPTH:
            raise RefusedFileError(f'{self.name}: damaged LMDB database (a tree of depth {self.depth})')

    def _page(self, number: int, kind: int) -> tuple[bytes, list[int]]:
        """Page `number`, which must be a `kind` page, and the offsets of its nodes (each checked to lie within it)."""
        raw = self._read(number * self.page_size, self.page_size, f'page {number}')
        page_number, _pad, flags, lower, upper = _LMDB_PAGE.unpack_from(raw)
        if page_number != number or flags & (_P_BRANCH | _P_LEAF | _P_OVERFLOW) != kind or \
                not _LMDB_PAGE.size <= lower <= upper <= self.page_size or lower % 2:
            raise RefusedFileError(f'{self.name}: damaged LMDB database (page {number})')
        offsets = list(struct.unpack_from(f'<{(lower - _LMDB_PAGE.size) // 2}H', raw, _LMDB_PAGE.size))
        if any(not upper <= offset <= self.page_size - _LMDB_NODE.size for offset in offsets):
            raise RefusedFileError(f'{self.name}: damaged LMDB database (a node outside page {number})')
        return raw, offsets

    def entries(self, max_entries: int | None = None) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) of the main database in key order, up to max_entries, each read when it is reached."""
        if self.root == _LMDB_NO_PAGE:
            return
        count, visited = 0, 0
        stack = [(self.root, 1)]  # Pages still to visit, the next on top.
        while stack:
            number, depth = stack.pop()
            visited += 1
            if depth > max(self.depth, 1) or visited * self.page_size > self.file_size:
                raise RefusedFileError(f'{self.name}: damaged LMDB database (its tree is deeper than {self.depth} or '
                                       f'has more pages than the file)')
            if depth < self.depth:
                raw, offsets = self._page(number, _P_BRANCH)
                children = []
                for offset in offsets:
                    low, high, flags, _key_size = _LMDB_NODE.unpack_from(raw, offset)
                    children.append((low | high << 16 | flags << 32, depth + 1))
                stack.extend(reversed(children))
                continue
            raw, offsets = self._page(number, _P_LEAF)
            for offset in offsets:
                if max_entries is not None and count >= max_entries:
                    return
                low, high, flags, key_size = _LMDB_NODE.unpack_from(raw, offset)
                size, start = low | high << 16, offset + _LMDB_NODE.size
                key = raw[start:start + key_size]
                what = f'entry {key[:100].decode(errors="replace")}'
                if flags & ~_F_BIGDATA:
                    raise self._refused(f'{what} has flags {flags:#x} (a sub-database or duplicates, which LSUN\'s have not)')
                if not flags & _F_BIGDATA:
                    if start + key_size + size > self.page_size:
                        raise RefusedFileError(f'{self.name}: damaged LMDB database ({what} outside page {number})')
                    value = raw[start + key_size:start + key_size + size]
                else:
                    (first,) = struct.unpack_from('<Q', raw, start + key_size)
                    value_offset = first * self.page_size + _LMDB_OVERFLOW.size
                    if value_offset + size > self.file_size:
                        raise self._refused(f'{what} claims {size:,} bytes at byte {value_offset:,}, beyond the '
                                            f'{self.file_size:,} bytes of data.mdb')
                    page_number, _pad, page_flags, pages = _LMDB_OVERFLOW.unpack(self._read(first * self.page_size,
                                                                                            _LMDB_OVERFLOW.size, what))
                    if page_number != first or page_flags & _P_OVERFLOW == 0 or size > pages * self.page_size - _LMDB_OVERFLOW.size:
                        raise RefusedFileError(f'{self.name}: damaged LMDB database ({what}: overflow page {first})')
                    value = self._read(value_offset, size, what)
                count += 1
                yield key, value

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> LmdbDatabase:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
