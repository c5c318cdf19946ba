"""A disk that fills up while a run writes: how tests/test_write_failure.py makes writes fail.

    python tests/support/full_disk.py <train.py options>

runs train.py's command line with `fill()` applied from the environment in every process of the run (nothing fails
when FULL_DISK_FILES is not set, so that the command a failed run prints, which names this script, continues it as
train.py would):

    FULL_DISK_FILES     a regular expression: writes to a file whose name matches it (searched in the base name, so
                        that a snapshot's temporary file '.network-snapshot-000000.016.pkl.<pid>.<hex>.tmp' matches
                        'network-snapshot-000000.016') fail...
    FULL_DISK_AFTER     ...after this many have been written (default 0): files written whole, or for a file opened
                        for appending (stats.jsonl, log.txt), lines

A failing write writes the first half of its bytes, then raises OSError(ENOSPC), as a disk does that fills up in
the middle of a write. Every file a run writes is opened through builtins.open or os.fdopen (snapshots), which
`fill` wraps (a file Pillow opens is given no descriptor, so that it writes through write()).
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # The repository.


class _FillingFile:
    """A file object whose writes fail once the disk is 'full' (see the module docstring); anything else is the file's."""

    def __init__(self, file, disk: 'FullDisk') -> None:
        self._file, self._disk = file, disk
        self._append = 'a' in str(file.mode)
        self._full = not self._append and disk.full()  # A file written whole: counted once.

    def write(self, data):
        if self._full or (self._append and self._disk.full()):
            half = len(data) // 2
            if half:
                self._file.write(data[:half])
                self._file.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._file.write(data)

    def fileno(self) -> int:
        if '+' in str(getattr(self._file, 'mode', '')):  # Pillow's 'w+b': it would write to the descriptor itself.
            raise io.UnsupportedOperation('fileno')
        return self._file.fileno()

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._file.__exit__(*exc)

    def __iter__(self):
        return iter(self._file)


class FullDisk:
    """Counts the files (appended: the writes) whose names match `pattern`; those after the first `after` fail."""

    def __init__(self, pattern: str, after: int = 0) -> None:
        self.pattern, self.after, self.writes = re.compile(pattern), after, 0

    def full(self) -> bool:
        self.writes += 1
        return self.writes > self.after

    def wrap(self, file, name) -> object:
        if isinstance(name, (str, bytes, os.PathLike)) and self.pattern.search(os.path.basename(os.fsdecode(name))):
            mode = getattr(file, 'mode', 'r')
            if any(c in str(mode) for c in 'wax+'):
                return _FillingFile(file, self)
        return file


def fill(patch_setattr, pattern: str, after: int = 0) -> FullDisk:
    """Make writes to files matching `pattern` fail after `after` of them, with `patch_setattr(obj, name, value)`
    (pytest's monkeypatch.setattr, or setattr in a process of its own)."""
    disk = FullDisk(pattern, after)
    real_open, real_fdopen = builtins.open, os.fdopen

    def open_(file, *args, **kwargs):
        return disk.wrap(real_open(file, *args, **kwargs), file)

    def fdopen(fd, *args, **kwargs):
        file = real_fdopen(fd, *args, **kwargs)
        return disk.wrap(file, os.readlink(f'/proc/self/fd/{fd}') if os.path.exists(f'/proc/self/fd/{fd}') else None)
    patch_setattr(builtins, 'open', open_)
    patch_setattr(io, 'open', open_)
    patch_setattr(os, 'fdopen', fdopen)
    return disk


# At the top level, so that the processes that train.py --gpus=N spawns (which import this module as their main) fill up too.
if os.environ.get('FULL_DISK_FILES') and __name__ in ('__main__', '__mp_main__'):
    fill(setattr, os.environ['FULL_DISK_FILES'], int(os.environ.get('FULL_DISK_AFTER', 0)))

if __name__ == '__main__':
    import train
    train.main()
