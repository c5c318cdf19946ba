"""dnnlib.util: EasyDict, the allow-list of construct_class_by_name, parse_int_list, format_time, open_url."""

import io
import os
import tempfile

import pytest
import torch

import dnnlib
from dnnlib import util
from bench.hostile_cases import LoopbackServer, send


def test_easydict_attribute_access():
    d = dnnlib.EasyDict(a=1)
    d.b = 2
    assert d['b'] == 2 and d.a == 1
    del d.a
    assert 'a' not in d
    with pytest.raises(AttributeError):
        _ = d.missing


def test_to_plain_strips_easydict():
    plain = util.to_plain(dnnlib.EasyDict(a=dnnlib.EasyDict(b=[dnnlib.EasyDict(c=1)]), t=(1, 2)))
    assert type(plain) is dict and type(plain['a']) is dict and type(plain['a']['b'][0]) is dict
    assert plain == {'a': {'b': [{'c': 1}]}, 't': (1, 2)}


def test_construct_class_by_name_builds_allowed_classes():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = util.construct_class_by_name([p], class_name='torch.optim.Adam', lr=0.5, betas=(0.0, 0.9))
    assert type(opt) is torch.optim.Adam and opt.defaults['lr'] == 0.5 and opt.defaults['betas'] == (0.0, 0.9)
    G = util.construct_class_by_name(class_name='training.networks.sngan.CNNGenerator', c_dim=0, img_resolution=32,
                                     img_channels=3, ch=4, z_dim=2)
    assert type(G).__name__ == 'CNNGenerator' and G.init_kwargs.ch == 4


def test_class_names_of_older_snapshots_build_the_moved_classes():
    """training/ was one flat package; snapshots and configs written then name its classes by the old paths."""
    from training.data.dataset import ImageFolderDataset
    from training.recipes.schedule import FixedSchedule, ProgressiveSchedule
    from training.step.loss import GANLoss
    assert [util.get_class(f'training.{name}') for name in ['dataset.ImageFolderDataset', 'loss.GANLoss',
                                                            'schedule.FixedSchedule', 'schedule.ProgressiveSchedule']] \
        == [ImageFolderDataset, GANLoss, FixedSchedule, ProgressiveSchedule]
    with pytest.raises(util.ConfigError):
        util.get_class('training.loss.os')  # Only those four names.


@pytest.mark.parametrize('name', ['collections.OrderedDict', 'logging.basicConfig', 'torch.hub.load', 'os.system',
                                  'training.data.dataset.os.system', 'training.training_loop.training_loop',
                                  'builtins.eval', 'subprocess.Popen', 'training', '', 'torch.optim.SGD'])
def test_construct_class_by_name_refuses_everything_else(name, tmp_path):
    with pytest.raises(util.ConfigError, match='not a class this project builds'):
        util.construct_class_by_name(class_name=name, filename=str(tmp_path / 'marker'))
    assert not (tmp_path / 'marker').exists()


def test_refused_name_imports_nothing(tmp_path, monkeypatch):
    """A module that would run code on import is never imported for a name outside the allow-list."""
    marker = tmp_path / 'marker'
    (tmp_path / 'evilmod.py').write_text(f'open({str(marker)!r}, "w").close()\nclass X: pass\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ('evilmod.X', 'training.evilmod.X'):
        with pytest.raises(util.ConfigError):
            util.construct_class_by_name(class_name=name)
    assert not marker.exists()


def test_unknown_kwargs_are_refused():
    with pytest.raises(util.ConfigError, match='Adam takes no argument "bogus"'):
        util.construct_class_by_name([torch.nn.Parameter(torch.zeros(1))], class_name='torch.optim.Adam', bogus=1)


@pytest.mark.parametrize('kwargs,message', [
    ('not a dict', 'expected a dict'),
    ({'class_name': 5}, 'class name must be a string'),
    ({'path': 'x'}, 'class name must be a string'),
    ({'class_name': 'logging.basicConfig', 'filename': 'x'}, 'not a class this project builds'),
    ({'class_name': 'training.data.dataset.ImageFolderDataset', 'path': 'x', 'filemode': 'w'}, 'takes no argument "filemode"'),
    ({'class_name': 'training.data.dataset.ImageFolderDataset', 'path': object()}, 'plain data'),
    ({'class_name': 'training.data.dataset.ImageFolderDataset', 'path': {1: 'x'}}, 'keys must be str'),
])
def test_check_class_kwargs_refuses(kwargs, message):
    with pytest.raises(util.ConfigError, match=message):
        util.check_class_kwargs(kwargs, 'training_set_kwargs')


def test_check_plain_bounds_nesting():
    deep = []
    for _ in range(util.MAX_PLAIN_DEPTH + 1):
        deep = [deep]
    with pytest.raises(util.ConfigError, match='nested deeper'):
        util.check_plain(deep, 'x')
    util.check_plain({'a': [1, 2.5, None, 'b', (True,)]}, 'x')  # Plain data passes.
    kwargs = util.check_class_kwargs({'class_name': 'training.data.dataset.ImageFolderDataset', 'path': 'x', 'xflip': True}, 'x')
    assert isinstance(kwargs, dnnlib.EasyDict) and kwargs.xflip is True


@pytest.mark.parametrize('text,expected', [('0-3,7', [0, 1, 2, 3, 7]), ('5', [5]), ('1, 3-4', [1, 3, 4])])
def test_parse_int_list(text, expected):
    assert util.parse_int_list(text) == expected


@pytest.mark.parametrize('text', ['a', '3-1', '1-'])
def test_parse_int_list_rejects(text):
    with pytest.raises(ValueError):
        util.parse_int_list(text)


def test_format_time():
    assert util.format_time(42) == '42s'
    assert util.format_time(185) == '3m 05s'
    assert util.format_time(2 * 3600 + 69) == '2h 01m 09s'
    assert util.format_time(86400 + 4 * 3600) == '1d 04h 00m'


def test_open_url_local_path(tmp_path):
    p = tmp_path / 'x.bin'
    p.write_bytes(b'abc')
    with util.open_url(str(p)) as f:
        assert f.read() == b'abc'
    with util.open_url(p.as_uri()) as f:
        assert f.read() == b'abc'
    with pytest.raises(FileNotFoundError):
        util.open_url(str(tmp_path / 'missing'))


def _cache_files(cache_dir) -> list[str]:
    folder = os.path.join(cache_dir, 'downloads')
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def test_open_url_http_cached(tmp_path):
    """Fetch a file once over loopback, then again with the server gone; without a cache the download is an
    anonymous temporary file."""
    cache = str(tmp_path / 'cache')
    with LoopbackServer({'/blob.bin': send(b'payload')}) as server:
        url = server.url('/blob.bin')
        with util.open_url(url, cache_dir=cache, verbose=False) as f:
            assert f.read() == b'payload'
        with util.open_url(url, cache_dir=cache, verbose=False, cache=False) as f:
            assert f.read() == b'payload' and not isinstance(f, io.BytesIO) and f.fileno() >= 0  # A file, not memory.
    assert server.requests == ['/blob.bin', '/blob.bin']
    with util.open_url(url, cache_dir=cache, verbose=False) as f:
        assert f.read() == b'payload'
    assert len(_cache_files(cache)) == 1 and _cache_files(cache)[0].endswith('_blob.bin')
    with pytest.raises(util.DownloadError, match='Could not download'):
        util.open_url(url, cache_dir=cache, verbose=False, cache=False, num_attempts=1)


CAP = 64 << 10  # The cap of the downloads below.


@pytest.mark.parametrize('route,served', [
    ('/declared', lambda body: send(body)),                                    # an honest Content-Length over the cap
    ('/unsized', lambda body: send(body, length=None)),                        # no length: the connection's end delimits it
    ('/lying', lambda body: send(body, length=100, chunked=True)),             # claims 100 bytes, sends 3x the cap chunked
])
@pytest.mark.parametrize('cache', [True, False], ids=['cache', 'no-cache'])
def test_download_over_the_cap_is_refused_in_one_line_and_leaves_nothing(tmp_path, monkeypatch, route, served, cache):
    body = os.urandom(3 * CAP)
    kept, temporary_file = [], tempfile.TemporaryFile
    monkeypatch.setattr(util.tempfile, 'TemporaryFile', lambda *a, **k: kept.append(temporary_file(*a, **k)) or kept[-1])
    with LoopbackServer({route: served(body)}) as server:
        with pytest.raises(util.DownloadError) as info:
            util.open_url(server.url(route), cache_dir=str(tmp_path), verbose=False, cache=cache, max_bytes=CAP)
    assert str(info.value) == f'Could not download {server.url(route)}: it is larger than the cap of {CAP:,} bytes ' \
                              f'(raise it with GNGAN_MAX_DOWNLOAD_BYTES, or download the file by other means and pass its local path)'
    assert server.requests == [route]  # Refused at once, not tried again.
    assert os.listdir(tmp_path) == ([] if not cache else ['downloads']) and _cache_files(tmp_path) == []
    assert len(kept) == (0 if cache else 1) and all(f.closed for f in kept)


def test_download_cap_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv('GNGAN_MAX_DOWNLOAD_BYTES', str(CAP))
    assert util.max_download_bytes() == CAP
    with LoopbackServer({'/a': send(bytes(CAP)), '/b': send(bytes(CAP + 1), length=None)}) as server:
        with util.open_url(server.url('/a'), cache_dir=str(tmp_path), verbose=False) as f:
            assert f.read() == bytes(CAP)
        with pytest.raises(util.DownloadError, match=f'larger than the cap of {CAP:,} bytes'):
            util.open_url(server.url('/b'), cache_dir=str(tmp_path), verbose=False)
    monkeypatch.setenv('GNGAN_MAX_DOWNLOAD_BYTES', '2GB')
    with pytest.raises(util.DownloadError, match="^GNGAN_MAX_DOWNLOAD_BYTES must be a positive number of bytes, not '2GB'$"):
        util.open_url(server.url('/a'), cache_dir=str(tmp_path / 'other'), verbose=False)
    monkeypatch.delenv('GNGAN_MAX_DOWNLOAD_BYTES')
    assert util.max_download_bytes() == util.MAX_DOWNLOAD_BYTES == 4 << 30


def test_download_that_ends_early_leaves_no_cache_entry(tmp_path):
    """A server that declares 1000 bytes and sends 10: an error after every attempt, and nothing in the cache."""
    with LoopbackServer({'/short': send(b'0123456789', length=1000)}) as server:
        with pytest.raises(util.DownloadError, match=r'^Could not download http://127\.0\.0\.1:\d+/short \(\w+\)$'):
            util.open_url(server.url('/short'), cache_dir=str(tmp_path), verbose=False, num_attempts=2)
    assert server.requests == ['/short', '/short'] and _cache_files(tmp_path) == []


def test_a_download_is_announced_once_whatever_its_attempts(tmp_path, capsys):
    """Three attempts at a body that ends early, then a port nothing listens on: one 'Downloading' line each."""
    with LoopbackServer({'/short': send(b'0123456789', length=1000)}) as server:
        with pytest.raises(util.DownloadError):
            util.open_url(server.url('/short'), cache_dir=str(tmp_path), num_attempts=3)
    assert server.requests == ['/short'] * 3
    assert capsys.readouterr().out.splitlines() == [f'Downloading {server.url("/short")} ...']
    with pytest.raises(util.DownloadError, match='ConnectionError'):
        util.open_url('http://127.0.0.1:9/x.pt', cache_dir=str(tmp_path))  # Port 9 (discard): refused on loopback.
    assert capsys.readouterr().out.splitlines() == ['Downloading http://127.0.0.1:9/x.pt ...']


@pytest.mark.parametrize('cache', [True, False], ids=['cache', 'no-cache'])
def test_download_streams_in_bounded_chunks(tmp_path, monkeypatch, cache):
    """The body never sits whole in memory: every read of the response asks for at most DOWNLOAD_CHUNK_BYTES, and
    the bytes arrive whole on disk."""
    import urllib3
    monkeypatch.setattr(util, 'DOWNLOAD_CHUNK_BYTES', 4096)
    requested, returned = [], []
    read = urllib3.response.HTTPResponse.read

    def recording_read(self, amt=None, *args, **kwargs):
        requested.append(amt)
        data = read(self, amt, *args, **kwargs)
        returned.append(len(data))
        return data
    monkeypatch.setattr(urllib3.response.HTTPResponse, 'read', recording_read)
    body = os.urandom(100 << 10)
    with LoopbackServer({'/a': send(body), '/b': send(body, length=None)}) as server:
        for route in ('/a', '/b'):
            requested.clear(), returned.clear()
            with util.open_url(server.url(route), cache_dir=str(tmp_path), verbose=False, cache=cache, max_bytes=len(body)) as f:
                assert f.read() == body
            assert None not in requested and max(requested) <= 4096 and max(returned) <= 4096, (requested, returned)
            assert sum(returned) == len(body)


def test_atomic_path_renames_on_success_and_removes_on_failure(tmp_path):
    from torch_utils.persistence import _TEMP_FILE
    target = tmp_path / 'out.png'
    with dnnlib.util.atomic_path(str(target), suffix='.png') as tmp:
        assert os.path.dirname(tmp) == str(tmp_path) and tmp.endswith('.tmp.png') and not target.exists()
        open(tmp, 'wb').write(b'new')
    assert target.read_bytes() == b'new' and os.listdir(tmp_path) == ['out.png']
    with pytest.raises(OSError, match='disk full'):
        with dnnlib.util.atomic_path(str(target)) as tmp:
            open(tmp, 'wb').write(b'half')
            assert _TEMP_FILE.fullmatch(os.path.basename(tmp))  # What remove_stale_temporaries finds after a crash.
            raise OSError('disk full')
    assert target.read_bytes() == b'new' and os.listdir(tmp_path) == ['out.png']  # Nothing half-written.


def test_first_line():
    assert dnnlib.util.first_line(ValueError('\n  bad value\nmore detail')) == 'bad value'
    assert dnnlib.util.first_line(ValueError('x' * 50), max_chars=10) == 'x' * 10
    assert dnnlib.util.first_line(KeyboardInterrupt()) == 'KeyboardInterrupt'


class _DiskFullAfter(io.RawIOBase):
    """A file that takes `room` bytes, then fails every write with ENOSPC, as a full disk does."""

    def __init__(self, room: int) -> None:
        self.room, self.data = room, bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if len(self.data) + len(data) > self.room:
            raise OSError(28, os.strerror(28))
        self.data += data
        return len(data)


def test_writing_names_the_file_of_torch_saves_failed_write(tmp_path):
    """torch.save reports a write that failed as a RuntimeError ('unexpected pos') raised while handling the OSError;
    writing() finds the OSError and names the file."""
    with pytest.raises(util.WriteError) as error:
        with util.writing(str(tmp_path / 'snapshot.pkl')):
            torch.save({'x': torch.zeros(10000)}, _DiskFullAfter(1000))
    assert isinstance(error.value.__cause__, RuntimeError) and 'unexpected pos' in str(error.value.__cause__)
    assert error.value.errno == 28 and str(error.value) == f'cannot write {tmp_path / "snapshot.pkl"}: No space left on device'
    with pytest.raises(RuntimeError, match='not about a file'):  # Other errors pass unchanged.
        with util.writing(str(tmp_path / 'x')):
            raise RuntimeError('not about a file')


def test_append_text_leaves_no_partial_line(tmp_path):
    """A line that does not fit (half of it written, then ENOSPC) is cut back: the file holds what it held before."""
    path = tmp_path / 'stats.jsonl'
    path.write_text('{"a": 1}\n')
    with open(path, 'ab', buffering=0) as raw:
        class HalfThenFull:
            name, fileno = raw.name, raw.fileno

            def write(self, data):
                raw.write(data[:len(data) // 2])
                raise OSError(28, os.strerror(28))
        with pytest.raises(util.WriteError, match=f'cannot write {path}: No space left on device'):
            util.append_text(HalfThenFull(), '{"b": 2}\n')
        util.append_text(raw, '{"c": 3}\n')
    assert path.read_text() == '{"a": 1}\n{"c": 3}\n'
