"""Generic utilities: attribute dicts, building objects from config, file/URL access, formatting."""

from __future__ import annotations

import hashlib
import importlib
import io
import os
import re
import tempfile
import urllib.parse
from typing import Any, BinaryIO

#----------------------------------------------------------------------------


class EasyDict(dict):
    """A dict whose items can also be read and written as attributes (cfg.lr == cfg['lr'])."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:
        del self[name]


def to_plain(obj: Any) -> Any:
    """Recursively turn EasyDicts (and other dict/list subclasses) into plain dicts/lists/tuples.

    Snapshots and JSON files hold only plain containers, so configs pass through here first.
    """
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return tuple(to_plain(v) for v in obj)
    if isinstance(obj, list):
        return [to_plain(v) for v in obj]
    return obj

#----------------------------------------------------------------------------
# Building objects from config dicts.


def get_obj_by_name(name: str) -> Any:
    """Resolve a dotted name such as 'torch.optim.Adam' or 'training.loss.GANLoss' to the object."""
    parts = name.split('.')
    # Try the longest importable module prefix, then walk attributes.
    for i in range(len(parts) - 1, 0, -1):
        module_name = '.'.join(parts[:i])
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name is not None and not module_name.startswith(e.name):
                raise  # A real import error inside an existing module.
            continue
        obj = module
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            continue
        return obj
    raise ValueError(f'Cannot find "{name}"')


def call_func_by_name(*args: Any, func_name: str, **kwargs: Any) -> Any:
    """Call the function (or class) named by its dotted path."""
    func = get_obj_by_name(func_name)
    if not callable(func):
        raise TypeError(f'"{func_name}" is not callable')
    return func(*args, **kwargs)


def construct_class_by_name(*args: Any, class_name: str, **kwargs: Any) -> Any:
    """Instantiate the class named by its dotted path: the way EasyDict configs become objects."""
    return call_func_by_name(*args, func_name=class_name, **kwargs)

#----------------------------------------------------------------------------
# Formatting and parsing.


def format_time(seconds: float) -> str:
    """Human-readable duration: '42s', '3m 05s', '2h 01m 09s', '1d 04h 00m'."""
    s = int(round(seconds))
    if s < 60:
        return f'{s}s'
    if s < 60 * 60:
        return f'{s // 60}m {s % 60:02d}s'
    if s < 24 * 60 * 60:
        return f'{s // 3600}h {(s // 60) % 60:02d}m {s % 60:02d}s'
    return f'{s // 86400}d {(s // 3600) % 24:02d}h {(s // 60) % 60:02d}m'


def parse_int_list(text: str | list[int] | tuple[int, ...]) -> list[int]:
    """Parse '0-3,7,10-11' into [0, 1, 2, 3, 7, 10, 11]; lists pass through."""
    if isinstance(text, (list, tuple)):
        return [int(v) for v in text]
    values = []
    for part in str(text).split(','):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r'(-?\d+)\s*-\s*(-?\d+)', part)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if hi < lo:
                raise ValueError(f'Invalid range "{part}": end before start')
            values.extend(range(lo, hi + 1))
        elif re.fullmatch(r'-?\d+', part):
            values.append(int(part))
        else:
            raise ValueError(f'Invalid integer list item "{part}" (expected e.g. "0-3,7")')
    return values

#----------------------------------------------------------------------------
# Files and URLs.


def is_url(obj: Any) -> bool:
    """True for http(s):// and file:// addresses."""
    if not isinstance(obj, str) or '://' not in obj:
        return False
    return urllib.parse.urlparse(obj).scheme in ('http', 'https', 'file')


def default_cache_dir() -> str:
    """Where downloads are cached: $GNGAN_CACHE_DIR, else ~/.cache/gngan."""
    if 'GNGAN_CACHE_DIR' in os.environ:
        return os.environ['GNGAN_CACHE_DIR']
    return os.path.join(os.path.expanduser('~'), '.cache', 'gngan')


class DownloadError(OSError):
    """A URL could not be fetched (offline, unreachable host, HTTP error)."""


def open_url(url: str, cache_dir: str | None = None, num_attempts: int = 3, verbose: bool = True,
             cache: bool = True, timeout: float = 30) -> BinaryIO:
    """Open a local path, file:// URL or http(s):// URL as a binary file object.

    http(s) downloads are cached under `cache_dir/downloads/<md5 of url>_<name>` and written to a
    temporary name first, so an interrupted download never poisons the cache. Failure raises
    DownloadError with one readable line naming the URL.
    """
    if not is_url(url):
        if not os.path.isfile(url):
            raise FileNotFoundError(f'No such file: {url}')
        return open(url, 'rb')
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == 'file':
        return open(urllib.parse.unquote(parsed.path), 'rb')

    if cache_dir is None:
        cache_dir = default_cache_dir()
    url_md5 = hashlib.md5(url.encode('utf-8')).hexdigest()
    basename = os.path.basename(parsed.path) or 'download'
    cache_file = os.path.join(cache_dir, 'downloads', f'{url_md5}_{basename}')
    if cache and os.path.isfile(cache_file):
        return open(cache_file, 'rb')

    import requests  # Imported lazily: only downloads need it.
    data = None
    last_error: Exception | None = None
    for _attempt in range(num_attempts):
        try:
            if verbose:
                print(f'Downloading {url} ...', flush=True)
            with requests.get(url, timeout=timeout) as res:
                res.raise_for_status()
                data = res.content
            break
        except requests.RequestException as e:
            last_error = e
    if data is None:
        reason = type(last_error).__name__ if last_error is not None else 'unknown error'
        if isinstance(last_error, requests.HTTPError) and last_error.response is not None:
            reason = f'HTTP {last_error.response.status_code}'
        raise DownloadError(f'Could not download {url} ({reason})')

    if cache:
        os.makedirs(os.path.dirname(cache_file), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(cache_file), prefix='.tmp-')
        try:
            with os.fdopen(fd, 'wb') as f:
                f.write(data)
            os.replace(tmp, cache_file)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
    return io.BytesIO(data)

#----------------------------------------------------------------------------


class Logger:
    """Copy everything written to stdout (and stderr) into a log file as well, line-buffered."""

    def __init__(self, file_name: str, file_mode: str = 'a') -> None:
        import sys
        self._sys = sys
        self.file = open(file_name, file_mode)
        self.stdout, self.stderr = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = self, self

    def write(self, text: str) -> None:
        self.file.write(text)
        self.stdout.write(text)
        if '\n' in text:
            self.flush()

    def flush(self) -> None:
        self.file.flush()
        self.stdout.flush()

    def isatty(self) -> bool:
        return False

    def close(self) -> None:
        if self._sys.stdout is self:
            self._sys.stdout = self.stdout
        if self._sys.stderr is self:
            self._sys.stderr = self.stderr
        self.file.close()
