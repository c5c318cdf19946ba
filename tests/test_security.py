"""Crafted snapshots against every entry point that reads one: the Python API (persistence.load_snapshot),
generate.py, calc_metrics.py (with and without --data) and train.py --resume.

Each snapshot is made here, in the test, from a valid one: plain data that asks for code (a class name
or pickle global that would create a marker file, truncate a file, import a module or run a command)
or that is malformed or oversized. Every entry point must refuse every one of them with one line and
a non-zero exit, and the marker file must never appear.
"""

import io
import os
import pickle
import tempfile
import zipfile

import pytest
import torch
from click.testing import CliRunner

import calc_metrics
import generate
import train
from torch_utils import persistence
from training.networks import sngan

#----------------------------------------------------------------------------
# A valid snapshot as plain data, and ways to break it.


def valid_payload() -> dict:
    """What save_snapshot writes for a tiny generator, as torch.load(weights_only=True) reads it back."""
    torch.manual_seed(0)
    G = sngan.CNNGenerator(c_dim=0, img_resolution=16, img_channels=3, ch=4, z_dim=4)
    data = dict(G=G, G_ema=G, training_set_kwargs=dict(class_name='training.data.dataset.ImageFolderDataset', path='data.zip'),
                progress=dict(step=1, cur_nimg=64), cfg=dict(G_opt_kwargs=dict(class_name='torch.optim.Adam', lr=1e-3)))
    with tempfile.TemporaryDirectory() as tmp:
        persistence.save_snapshot(os.path.join(tmp, 'valid.pkl'), data)
        return torch.load(os.path.join(tmp, 'valid.pkl'), weights_only=True)


def network(tag, init_kwargs, state_dict=None):
    return {'__persistent_module__': tag, 'init_kwargs': init_kwargs, 'state_dict': {} if state_dict is None else state_dict}


def with_data(**changes):
    def make(payload, ctx):
        for key, value in changes.items():
            payload['data'][key] = value(ctx) if callable(value) else value
        return payload
    return make


def with_network(**changes):
    """Change fields of the G_ema entry (also used for G) of the payload."""
    def make(payload, ctx):
        for key, value in changes.items():
            payload['data']['G_ema'][key] = value(ctx) if callable(value) else value
        payload['data']['G'] = payload['data']['G_ema']
        return payload
    return make


def hub_dir(ctx):
    """A directory whose hubconf.py creates the marker: what torch.hub.load(source='local') would run."""
    os.makedirs(ctx['tmp'] / 'hub', exist_ok=True)
    (ctx['tmp'] / 'hub' / 'hubconf.py').write_text(f'open({str(ctx["marker"])!r}, "w").close()\ndef x(): pass\n')
    return str(ctx['tmp'] / 'hub')


class Reduce:
    """Pickles as a call of func(*args): what a malicious pickle does."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def unicode_op(text: str) -> bytes:
    return b'X' + len(text.encode()).to_bytes(4, 'little') + text.encode()


def nested_pickle(depth: int) -> bytes:
    """Pickle opcodes of {'format': ..., 'version': 1, 'data': {'progress': [[[...]]]}} with `depth` nested
    lists: `depth` EMPTY_LISTs then `depth - 1` APPENDs (pickle.dumps itself would hit the recursion limit)."""
    return (b'\x80\x02}(' + unicode_op('format') + unicode_op('gngan-snapshot') + unicode_op('version') + b'K\x01' +
            unicode_op('data') + b'}(' + unicode_op('progress') + b']' * depth + b'a' * (depth - 1) + b'uu.')


def replace_entry(raw: bytes, suffix: str, make_bytes, compress=zipfile.ZIP_STORED) -> bytes:
    """The zip archive `raw` with the entry ending in `suffix` replaced."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(raw)) as src, zipfile.ZipFile(out, 'w') as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename.endswith(suffix):
                dst.writestr(zipfile.ZipInfo(info.filename), make_bytes(data), compress_type=compress)
            else:
                dst.writestr(zipfile.ZipInfo(info.filename), data, compress_type=zipfile.ZIP_STORED)
    return out.getvalue()


def evil_pickle(ctx):
    return pickle.dumps({'format': 'gngan-snapshot', 'version': 1, 'data': {'G': Reduce(open, str(ctx['marker']), 'w')}}, protocol=2)


def as_bytes(make_raw):
    """A crafted file given as raw bytes (from the bytes of the valid snapshot) instead of a payload."""
    make_raw.raw = True
    return make_raw


HUGE_KWARGS = dict(c_dim=0, img_resolution=16, img_channels=3, ch=2048, z_dim=4)  # 11 GB of weights when built.


def broadcast_state_dict(kwargs):
    """The state dict of sngan.CNNGenerator(**kwargs) with every tensor a view of one stored zero: the right
    shapes, a few bytes in the file."""
    with torch.device('meta'):
        shapes = {k: (v.shape, v.dtype) for k, v in sngan.CNNGenerator(**kwargs).state_dict().items()}
    return {k: torch.zeros((), dtype=dtype).expand(shape) for k, (shape, dtype) in shapes.items()}


def touch(ctx):
    return f'touch {ctx["marker"]}'


# name -> (how to craft it, a word of the one-line refusal)
CRAFTED = {
    # Code execution through class names.
    'dataset basicConfig': (with_data(training_set_kwargs=lambda ctx: dict(class_name='logging.basicConfig', filename=str(ctx['marker']), filemode='w')), 'logging.basicConfig'),
    'dataset torch.hub.load': (with_data(training_set_kwargs=lambda ctx: dict(class_name='torch.hub.load', repo_or_dir=hub_dir(ctx), model='x', source='local', trust_repo=True)), 'torch.hub.load'),
    'dataset os.system': (with_data(training_set_kwargs=lambda ctx: dict(class_name='os.system', command=touch(ctx))), 'os.system'),
    'dataset os.system via project module': (with_data(training_set_kwargs=lambda ctx: dict(class_name='training.data.dataset.os.system', command=touch(ctx))), 'training.data.dataset.os.system'),
    'dataset module import': (with_data(training_set_kwargs=dict(class_name='evilmod.Evil')), 'evilmod.Evil'),
    'dataset project module import': (with_data(training_set_kwargs=dict(class_name='training.evilmod.Evil')), 'training.evilmod.Evil'),
    'dataset unknown kwarg': (with_data(training_set_kwargs=dict(class_name='training.data.dataset.ImageFolderDataset', path='x', filemode='w')), 'filemode'),
    'dataset non-plain kwarg': (with_data(training_set_kwargs=dict(class_name='training.data.dataset.ImageFolderDataset', path=torch.zeros(2))), 'plain data'),
    'dataset without class_name': (with_data(training_set_kwargs=dict(path='x')), 'class name'),
    'dataset not a dict': (with_data(training_set_kwargs='training.data.dataset.ImageFolderDataset'), 'training_set_kwargs'),
    'network basicConfig': (with_network(__persistent_module__='logging.basicConfig', init_kwargs=lambda ctx: dict(filename=str(ctx['marker']), filemode='w')), 'logging.basicConfig'),
    'network subprocess.Popen': (with_network(__persistent_module__='subprocess.Popen', init_kwargs=lambda ctx: dict(args=['touch', str(ctx['marker'])])), 'subprocess.Popen'),
    'network torch.hub.load': (with_network(__persistent_module__='torch.hub.load', init_kwargs=lambda ctx: dict(repo_or_dir=hub_dir(ctx), model='x', source='local')), 'torch.hub.load'),
    'network project function': (with_network(__persistent_module__='training.training_loop.training_loop', init_kwargs=lambda ctx: dict(run_dir=str(ctx['marker']))), 'training.training_loop.training_loop'),
    'network non-network project class': (with_network(__persistent_module__='training.data.dataset.ImageFolderDataset', init_kwargs=lambda ctx: dict(path=str(ctx['marker']))), "this project's networks"),
    'network inside progress': (with_data(progress=lambda ctx: {'x': network('logging.basicConfig', dict(filename=str(ctx['marker'])))}), 'logging.basicConfig'),
    'preset G_kwargs': (with_data(cfg=lambda ctx: dict(G_kwargs=dict(class_name='logging.basicConfig', filename=str(ctx['marker'])))), 'logging.basicConfig'),
    'preset optimizer in a list': (with_data(cfg=lambda ctx: dict(opts=[dict(class_name='os.system', command=touch(ctx))])), 'os.system'),
    'preset unknown optimizer kwarg': (with_data(cfg=dict(G_opt_kwargs=dict(class_name='torch.optim.Adam', foo=1))), 'foo'),
    # Code execution through pickle globals.
    'legacy pickle with open()': (as_bytes(lambda raw, ctx: evil_pickle(ctx)), 'refused'),
    'zip whose data.pkl calls open()': (as_bytes(lambda raw, ctx: replace_entry(raw, 'data.pkl', lambda _: evil_pickle(ctx))), 'refused'),
    'zip whose data.pkl calls os.system': (as_bytes(lambda raw, ctx: replace_entry(raw, 'data.pkl', lambda _: pickle.dumps(Reduce(os.system, touch(ctx)), protocol=2))), 'refused'),
    # Malformed networks.
    'class name not a string': (with_network(__persistent_module__=5), 'class name must be a string'),
    'class name a list': (with_network(__persistent_module__=['a']), 'class name must be a string'),
    'kwargs not a dict': (with_network(init_kwargs=[1, 2]), 'init_kwargs: expected a dict'),
    'kwargs unknown name': (with_network(init_kwargs=lambda ctx: dict(c_dim=0, img_resolution=16, img_channels=3, ch=4, z_dim=4, bogus=1)), 'bogus'),
    'kwargs impossible': (with_network(init_kwargs=dict(c_dim=0, img_resolution=16, img_channels=3, ch=-4, z_dim=4)), 'cannot build'),
    'state dict missing a tensor': (lambda payload, ctx: (payload['data']['G_ema']['state_dict'].popitem(), with_network()(payload, ctx))[1], 'is missing'),
    'state dict wrong shape': (lambda payload, ctx: (payload['data']['G_ema']['state_dict'].update({k: torch.zeros(7) for k in list(payload['data']['G_ema']['state_dict'])[:1]}), with_network()(payload, ctx))[1], 'has shape'),
    'state dict not tensors': (with_network(state_dict={'a': 1}), 'named tensors'),
    'network extra field': (lambda payload, ctx: (payload['data']['G_ema'].update(extra=1), with_network()(payload, ctx))[1], 'exactly'),
    'generator is a string': (with_data(G_ema='G', G='G'), 'snapshot.G'),
    'progress is a list': (with_data(progress=[1]), 'snapshot.progress'),
    'deep nesting': (as_bytes(lambda raw, ctx: replace_entry(raw, 'data.pkl', lambda _: nested_pickle(100_000))), 'nested deeper'),
    # Oversized.
    'huge network via kwargs': (with_network(init_kwargs=dict(c_dim=0, img_resolution=16, img_channels=3, ch=10 ** 6, z_dim=4)), 'more than'),
    'millions of layers via kwargs': (with_network(__persistent_module__='training.networks.stylegan.MappingNetwork', init_kwargs=dict(z_dim=4, c_dim=0, w_dim=4, num_ws=2, num_layers=10 ** 6, layer_features=4)), 'more than'),
    'huge network over broadcast tensors': (with_network(init_kwargs=dict(HUGE_KWARGS), state_dict=lambda ctx: broadcast_state_dict(HUGE_KWARGS)), 'stored bytes'),
    'broadcast tensor in progress': (with_data(progress=dict(x=torch.zeros(1).expand(10 ** 12))), 'stored bytes'),
    'zip bomb': (as_bytes(lambda raw, ctx: replace_entry(raw, 'data/0', lambda data: bytes(64 << 20), compress=zipfile.ZIP_DEFLATED)), 'compressed'),
    # Not a snapshot.
    'truncated file': (as_bytes(lambda raw, ctx: raw[:len(raw) // 2]), 'refused'),
    'random bytes': (as_bytes(lambda raw, ctx: os.urandom(4096)), 'refused'),
    'empty file': (as_bytes(lambda raw, ctx: b''), 'refused'),
    'wrong format': (lambda payload, ctx: dict(payload, format='other'), 'not a GN-GAN snapshot'),
    'wrong version': (lambda payload, ctx: dict(payload, version=99), 'unsupported snapshot version'),
    'no data': (lambda payload, ctx: dict(payload, data=[1]), 'no data'),
}


@pytest.fixture
def ctx(tmp_path, monkeypatch):
    """Paths of one test; evilmod.py (which creates the marker when imported) is importable, as a module
    in the working directory or on PYTHONPATH would be."""
    marker = tmp_path / 'marker'
    evil = f'open({str(marker)!r}, "w").close()\nclass Evil:\n    def __init__(self, **kwargs): pass\n'
    (tmp_path / 'evilmod.py').write_text(evil)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv('GNGAN_CACHE_DIR', str(tmp_path / 'cache'))
    return dict(tmp=tmp_path, marker=marker)


def craft(name: str, ctx: dict) -> str:
    make, _ = CRAFTED[name]
    payload = valid_payload()
    path = ctx['tmp'] / 'crafted.pkl'
    if getattr(make, 'raw', False):
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        path.write_bytes(make(buffer.getvalue(), ctx))
    else:
        torch.save(make(payload, ctx), str(path))
    return str(path)


def assert_refused_in_one_line(result, expected: str):
    assert result.exit_code not in (0, None) and isinstance(result.exception, SystemExit), result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('Error:') and 'Traceback' not in result.output, result.output
    assert expected in lines[0], lines[0]


def tiny_dataset(ctx) -> str:
    import numpy as np
    import PIL.Image
    path = ctx['tmp'] / 'data.zip'
    with zipfile.ZipFile(path, 'w') as z:
        for i in range(2):
            buffer = io.BytesIO()
            PIL.Image.fromarray(np.full([16, 16, 3], i * 100, dtype=np.uint8)).save(buffer, format='png')
            z.writestr(f'img{i}.png', buffer.getvalue())
    return str(path)


ENTRY_POINTS = {
    'generate.py': lambda pkl, ctx: CliRunner().invoke(generate.main, [f'--network={pkl}', '--seeds=0', f'--outdir={ctx["tmp"] / "out"}']),
    'calc_metrics.py': lambda pkl, ctx: CliRunner().invoke(calc_metrics.main, [
        f'--network={pkl}', '--metrics=is50k', '--verbose=false', '--num-gen=2', f'--detector={ctx["tmp"] / "no-detector.pt"}']),
    'calc_metrics.py --data': lambda pkl, ctx: CliRunner().invoke(calc_metrics.main, [
        f'--network={pkl}', '--metrics=fid50k_full', '--verbose=false', '--num-gen=2', '--max-real=2', f'--data={tiny_dataset(ctx)}',
        f'--detector={ctx["tmp"] / "no-detector.pt"}']),
    'train.py --resume': lambda pkl, ctx: CliRunner().invoke(train.main, [f'--resume={pkl}', f'--outdir={ctx["tmp"] / "runs"}', '--kimg=0.001']),
}


@pytest.mark.parametrize('name', list(CRAFTED))
def test_api_refuses(name, ctx):
    path = craft(name, ctx)
    with pytest.raises(persistence.UnsafeSnapshotError) as info:
        persistence.load_snapshot(path)
    message = str(info.value)
    assert '\n' not in message and CRAFTED[name][1] in message, message
    assert not ctx['marker'].exists()


@pytest.mark.parametrize('entry', list(ENTRY_POINTS))
@pytest.mark.parametrize('name', list(CRAFTED))
def test_entry_point_refuses(name, entry, ctx):
    result = ENTRY_POINTS[entry](craft(name, ctx), ctx)
    assert_refused_in_one_line(result, CRAFTED[name][1])
    assert not ctx['marker'].exists()
    assert not (ctx['tmp'] / 'out').exists() and not (ctx['tmp'] / 'runs').exists()  # Nothing made.


def test_valid_snapshot_still_loads(ctx):
    """The crafted files differ from a loadable one only by what each breaks."""
    path = ctx['tmp'] / 'valid.pkl'
    torch.save(valid_payload(), str(path))
    data = persistence.load_snapshot(str(path))
    assert isinstance(data.G_ema, sngan.CNNGenerator) and data.training_set_kwargs.path == 'data.zip'


def test_attacks_work_without_the_allow_list(ctx):
    """The marker attacks are real: resolving the crafted class names by plain import, as
    construct_class_by_name did before the allow-list, creates the marker."""
    import importlib
    for name in ('dataset os.system', 'dataset module import'):
        payload = CRAFTED[name][0](valid_payload(), ctx)
        kwargs = dict(payload['data']['training_set_kwargs'])
        module_name, func = kwargs.pop('class_name').rsplit('.', 1)
        getattr(importlib.import_module(module_name), func)(**kwargs)
        assert ctx['marker'].exists(), name
        os.remove(ctx['marker'])
