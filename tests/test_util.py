"""dnnlib.util: EasyDict, construct_class_by_name, parse_int_list, format_time, open_url."""

import http.server
import os
import threading

import pytest

import dnnlib
from dnnlib import util


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


def test_construct_class_by_name():
    od = util.construct_class_by_name([('x', 1)], class_name='collections.OrderedDict')
    assert dict(od) == {'x': 1}
    assert util.get_obj_by_name('os.path.join') is os.path.join
    with pytest.raises(ValueError):
        util.get_obj_by_name('collections.NoSuchThing')


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


def test_open_url_http_cached(tmp_path):
    """Serve a file on loopback, fetch it once, then fetch it again with the server gone."""
    (tmp_path / 'srv').mkdir()
    (tmp_path / 'srv' / 'blob.bin').write_bytes(b'payload')
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path / 'srv'), **k)
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    server.RequestHandlerClass.log_message = lambda *a: None
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f'http://127.0.0.1:{server.server_address[1]}/blob.bin'
    try:
        with util.open_url(url, cache_dir=str(tmp_path / 'cache'), verbose=False) as f:
            assert f.read() == b'payload'
    finally:
        server.shutdown()
        server.server_close()
    with util.open_url(url, cache_dir=str(tmp_path / 'cache'), verbose=False) as f:
        assert f.read() == b'payload'
    with pytest.raises(util.DownloadError, match='Could not download'):
        util.open_url(url, cache_dir=str(tmp_path / 'cache'), verbose=False, cache=False, num_attempts=1)
