"""Generic utilities: attribute dicts, building objects from config, file/URL access, formatting."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import os
import re
import secrets
import tempfile
import urllib.parse
from typing import Any, BinaryIO, Iterator

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
# Plain data and building objects from config dicts.
#
# Class names also come from files (a snapshot holds the kwargs of its dataset and its preset), and a
# name that could pick any importable callable would let a file choose code: 'logging.basicConfig'
# truncates a file, 'torch.hub.load' runs a directory's hubconf.py. So construct_class_by_name builds
# only the classes of an allow-list, and a kwargs dict read from a file is checked against the class
# (check_class_kwargs) before anything is imported from or built for it.

PLAIN_SCALARS = (bool, int, float, str, type(None))
MAX_PLAIN_DEPTH = 32  # Nesting of plain data; configs need a handful of levels, and a cap keeps recursion bounded.

# Top-level packages of this project: a class name is imported only from these.
PROJECT_PACKAGES = ('training', 'metrics', 'torch_utils', 'ops')

# What may be built by name besides the networks, which register themselves (torch_utils.persistence).
ALLOWED_CLASS_NAMES = ('torch.optim.Adam', 'training.step.loss.GANLoss', 'training.data.dataset.ImageFolderDataset',
                       'training.recipes.schedule.FixedSchedule', 'training.recipes.schedule.ProgressiveSchedule')

# Where classes named in older snapshots and configs live now (training/ was one flat package).
RENAMED_CLASSES = {'training.loss.GANLoss': 'training.step.loss.GANLoss',
                   'training.dataset.ImageFolderDataset': 'training.data.dataset.ImageFolderDataset',
                   'training.schedule.FixedSchedule': 'training.recipes.schedule.FixedSchedule',
                   'training.schedule.ProgressiveSchedule': 'training.recipes.schedule.ProgressiveSchedule'}

_registered_classes: dict[str, type] = {}  # 'module.QualName' -> class.

_DOTTED_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+')


class ConfigError(ValueError):
    """A class name or kwargs dict (typically read from a file) that this project will not build."""


def check_choice(kind: str, value: str, choices: tuple[str, ...]) -> None:
    """Raise ValueError with a one-line message if `value` is not one of `choices`."""
    if value not in choices:
        raise ValueError(f'unknown {kind} "{value}"; valid: {", ".join(choices)}')


def check_plain(value: Any, where: str, depth: int = 0) -> None:
    """Raise ConfigError unless `value` is plain data: bool/int/float/str/None, and lists, tuples and
    str-keyed dicts of them, nested at most MAX_PLAIN_DEPTH deep."""
    if depth > MAX_PLAIN_DEPTH:
        raise ConfigError(f'{where}: nested deeper than {MAX_PLAIN_DEPTH} levels')
    if isinstance(value, PLAIN_SCALARS):
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_plain(v, f'{where}[{i}]', depth + 1)
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(f'{where}: dict keys must be str, got {type(k).__name__}')
            check_plain(v, f'{where}.{k}', depth + 1)
        return
    raise ConfigError(f'{where}: must be plain data (int/float/str/bool/None/list/tuple/dict), got {type(value).__name__}')


def register_class(cls: type) -> type:
    """Allow `cls` to be built by name (torch_utils.persistence does this for every network)."""
    _registered_classes[f'{cls.__module__}.{cls.__qualname__}'] = cls
    return cls


def get_class(name: Any) -> type:
    """The class called `name` ('training.data.dataset.ImageFolderDataset'), if this project may build it by name.

    Only modules of PROJECT_PACKAGES and those of ALLOWED_CLASS_NAMES are ever imported, so a name
    refused here has run nothing.
    """
    if not isinstance(name, str):
        raise ConfigError(f'class name must be a string, got {type(name).__name__}')
    name = RENAMED_CLASSES.get(name, name)
    if name not in _registered_classes and _DOTTED_NAME.fullmatch(name) and name.split('.')[0] in PROJECT_PACKAGES:
        parts = name.split('.')  # A network registers itself when its module is first imported.
        for i in range(len(parts) - 1, 0, -1):
            try:
                importlib.import_module('.'.join(parts[:i]))
                break
            except ImportError:
                continue
    if name in _registered_classes:
        return _registered_classes[name]
    if name in ALLOWED_CLASS_NAMES:
        module_name, attr = name.rsplit('.', 1)
        try:
            return getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f'class {name} is not available: {e}') from None
    raise ConfigError(f'"{name[:200]}" is not a class this project builds by name (its networks, '
                      f'{", ".join(ALLOWED_CLASS_NAMES)})')


def check_arguments(cls: type, names: Any, where: str) -> None:
    """Raise ConfigError unless every name in `names` is a keyword argument of cls's constructor."""
    params = inspect.signature(cls).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return  # Forwarded further; the callee checks them.
    accepted = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unknown = [name for name in names if name not in accepted]
    if unknown:
        raise ConfigError(f'{where}: {cls.__name__} takes no argument "{str(unknown[0])[:100]}"')


def check_class_kwargs(kwargs: Any, where: str) -> EasyDict:
    """Validate a {'class_name': ..., **kwargs} dict read from a file and return it as an EasyDict.

    The class must be one construct_class_by_name builds, the other keys its constructor's keyword
    arguments, and every value plain data, so that the dict chooses no code.
    """
    if not isinstance(kwargs, dict):
        raise ConfigError(f'{where}: expected a dict with a class_name, got {type(kwargs).__name__}')
    check_plain(kwargs, where)
    cls = get_class(kwargs.get('class_name'))
    check_arguments(cls, [k for k in kwargs if k != 'class_name'], where)
    return EasyDict(kwargs)


def construct_class_by_name(*args: Any, class_name: str, **kwargs: Any) -> Any:
    """Instantiate the allowed class named by its dotted path: the way EasyDict configs become objects."""
    cls = get_class(class_name)
    check_arguments(cls, kwargs, class_name)
    return cls(*args, **kwargs)

#----------------------------------------------------------------------------
# Formatting and parsing.


def expand_user(ctx: Any, param: Any, value: str | None) -> str | None:
    """click callback of path options: a leading '~' or '~user' expanded (no shell expands it after '=');
    URLs and other values pass unchanged."""
    return None if value is None else os.path.expanduser(value)


def first_line(error: BaseException, max_chars: int | None = None) -> str:
    """The first line of an exception's message (at most `max_chars`), or its type's name when it has none."""
    text = str(error).strip()
    return text.splitlines()[0][:max_chars] if text else type(error).__name__


@contextlib.contextmanager
def atomic_path(path: str, suffix: str = '') -> Iterator[str]:
    """A temporary path beside `path`, `.<name>.<pid>.<random>.tmp<suffix>`, to write the file to: renamed to
    `path` when the block ends, removed when it raises. A crash leaves at most that temporary file (its pid
    tells a stale one from a live writer's), an interrupt or a full disk nothing: never a half-written file
    under `path`. `suffix` keeps an extension for writers that choose the format by it (Pillow, imageio)."""
    folder, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f'.{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp{suffix}')
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


class WriteError(OSError):
    """An OSError (a full disk, a quota, a read-only file system) while writing `filename`: says which file."""

    def __init__(self, path: str, error: OSError) -> None:
        super().__init__(error.errno, error.strerror or first_line(error), path)

    def __str__(self) -> str:
        return f'cannot write {self.filename}: {self.strerror}'


def _os_error(error: BaseException) -> OSError | None:
    """`error` if it is an OSError; the OSError that a RuntimeError was raised in handling, if any (torch.save
    reports a failed write as 'RuntimeError: [enforce fail at inline_container.cc] unexpected pos', during the
    OSError's handling); else None."""
    while isinstance(error, (OSError, RuntimeError)):
        if isinstance(error, OSError):
            return error
        error = error.__cause__ or error.__context__
    return None


@contextlib.contextmanager
def writing(path: str) -> Iterator[None]:
    """Turn an OSError of the block (or torch.save's RuntimeError about one) into a WriteError naming `path`."""
    try:
        yield
    except WriteError:
        raise
    except (OSError, RuntimeError) as e:
        if (error := _os_error(e)) is None:
            raise
        raise WriteError(path, error) from e


def append_text(file: BinaryIO, text: str) -> None:
    """Append `text` to a file opened unbuffered for appending (open(path, 'ab', buffering=0)); if that fails (a full
    disk), cut the file back to what it held before, so that no line is left half-written, and raise WriteError."""
    start = os.fstat(file.fileno()).st_size
    data = memoryview(text.encode())
    try:
        while data:
            data = data[file.write(data):]  # A raw write may write less than asked.
    except OSError as e:
        with contextlib.suppress(OSError):
            os.ftruncate(file.fileno(), start)
        raise WriteError(file.name, e) from e


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
    """A URL could not be fetched (offline, unreachable host, HTTP error, a body larger than the cap)."""


# The most bytes a download may hold, unless $GNGAN_MAX_DOWNLOAD_BYTES says otherwise. The largest files the project
# fetches (VGG16's detector, 528 MB; the snapshots and checkpoints of the 1024x1024 and 256x256 networks) stay well
# below it; a larger file can be downloaded by other means and passed as a local path.
MAX_DOWNLOAD_BYTES = 4 << 30
DOWNLOAD_CHUNK_BYTES = 1 << 20  # A download is written to its file this many bytes at a time, never held whole.


def max_download_bytes() -> int:
    """The cap of downloads: $GNGAN_MAX_DOWNLOAD_BYTES when set (a positive integer), else MAX_DOWNLOAD_BYTES."""
    value = os.environ.get('GNGAN_MAX_DOWNLOAD_BYTES', '')
    if not value:
        return MAX_DOWNLOAD_BYTES
    if not value.isdigit() or int(value) == 0:
        raise DownloadError(f'GNGAN_MAX_DOWNLOAD_BYTES must be a positive number of bytes, not {value[:40]!r}')
    return int(value)


def _download(url: str, file: BinaryIO, max_bytes: int, timeout: float, verbose: bool) -> None:
    """Stream the body of `url` into `file`, at most `max_bytes` of it, DOWNLOAD_CHUNK_BYTES at a time.

    The body is taken as the server sends it (Accept-Encoding: identity, nothing decompressed here), and its
    bytes are counted as they arrive: a Content-Length over the cap is refused before the body is read, and a
    body that grows past the cap (whatever its headers said) when its bytes pass it."""
    import requests  # Imported lazily: only downloads need it.
    from tqdm import tqdm
    too_large = f'Could not download {url}: it is larger than the cap of {max_bytes:,} bytes (raise it with ' \
                f'GNGAN_MAX_DOWNLOAD_BYTES, or download the file by other means and pass its local path)'
    with requests.get(url, stream=True, timeout=timeout, headers={'Accept-Encoding': 'identity'}) as res:
        res.raise_for_status()
        declared = res.headers.get('Content-Length', '')
        if declared.isdigit() and int(declared) > max_bytes:
            raise DownloadError(too_large)
        received = 0
        with tqdm(total=int(declared) if declared.isdigit() else None, unit='B', unit_scale=True, unit_divisor=1024,
                  disable=not verbose, leave=False) as progress:
            for chunk in res.raw.stream(DOWNLOAD_CHUNK_BYTES, decode_content=False):
                received += len(chunk)
                if received > max_bytes:
                    raise DownloadError(too_large)
                file.write(chunk)
                progress.update(len(chunk))


def open_url(url: str, cache_dir: str | None = None, num_attempts: int = 3, verbose: bool = True,
             cache: bool = True, timeout: float = 30, max_bytes: int | None = None) -> BinaryIO:
    """Open a local path, file:// URL or http(s):// URL as a binary file object.

    http(s) downloads stream to a file, never whole into memory, and hold at most `max_bytes` (default:
    max_download_bytes()): with `cache`, to `cache_dir/downloads/<md5 of url>_<name>` under a temporary name
    renamed when the download is complete, so an interrupted or refused download never leaves a cache entry;
    without, to an anonymous temporary file.
    Failure raises DownloadError with one readable line naming the URL (and the cap, when the body exceeds it).
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
    import urllib3
    if max_bytes is None:
        max_bytes = max_download_bytes()
    if verbose:
        print(f'Downloading {url} ...', flush=True)  # Once: the attempts after a failed one are the same download.
    last_error: Exception | None = None
    for _attempt in range(num_attempts):
        try:
            if not cache:
                file = tempfile.TemporaryFile()
                try:
                    _download(url, file, max_bytes, timeout, verbose)
                    file.seek(0)
                    return file
                except BaseException:
                    file.close()
                    raise
            os.makedirs(os.path.dirname(cache_file), exist_ok=True)
            with atomic_path(cache_file) as tmp, open(tmp, 'wb') as file:
                _download(url, file, max_bytes, timeout, verbose)
            return open(cache_file, 'rb')
        except (requests.RequestException, urllib3.exceptions.HTTPError) as e:  # urllib3's: the body's stream broke.
            last_error = e
    reason = type(last_error).__name__ if last_error is not None else 'unknown error'
    if isinstance(last_error, requests.HTTPError) and last_error.response is not None:
        reason = f'HTTP {last_error.response.status_code}'
    raise DownloadError(f'Could not download {url} ({reason})')

#----------------------------------------------------------------------------


class Logger:
    """Copy everything written to stdout (and stderr) into a log file as well, line by line.

    A line that cannot be written to the file (a full disk) leaves the file as it was before that line, raises
    WriteError once, and from then on goes to the console only, so that the error itself can still be printed."""

    def __init__(self, file_name: str, file_mode: str = 'a') -> None:
        import sys
        self._sys = sys
        self.file = open(file_name, file_mode + 'b', buffering=0)
        self.line = ''  # Written to the console, not yet to the file: the file gets whole lines.
        self.stdout, self.stderr = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = self, self

    def write(self, text: str) -> None:
        self.stdout.write(text)
        if self.file is None:
            return
        self.line += text
        if '\n' in self.line:
            lines, self.line = self.line.rsplit('\n', 1)
            self.stdout.flush()
            try:
                append_text(self.file, lines + '\n')
            except WriteError:
                self._drop_file()
                raise

    def flush(self) -> None:
        self.stdout.flush()

    def isatty(self) -> bool:
        return False

    def _drop_file(self) -> None:
        with contextlib.suppress(OSError):
            self.file.close()
        self.file = None

    def close(self) -> None:
        if self._sys.stdout is self:
            self._sys.stdout = self.stdout
        if self._sys.stderr is self:
            self._sys.stderr = self.stderr
        if self.file is not None:
            if self.line:
                with contextlib.suppress(WriteError):
                    append_text(self.file, self.line)
            self._drop_file()
