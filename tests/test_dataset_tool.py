"""dataset_tool.py: every source format, the transforms, and clean failures on bad input.

Expected pixels come from the file formats' definitions (byte offsets), from
numpy slicing, or from block averages; the written datasets are read back both
directly (zipfile + PIL) and through training.data.dataset.ImageFolderDataset.
"""

import codecs
import errno
import io
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
import zlib

import numpy as np
import PIL.Image
import psutil
import pytest
from click.testing import CliRunner

import dataset_tool
from bench import hostile_cases
from tests.support.images import png16_bytes, png_bytes
from torch_utils import bounded_read
from training.data.dataset import ImageFolderDataset

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#----------------------------------------------------------------------------
# Helpers.

def random_pixels(rng: np.random.Generator, height: int, width: int, channels: int) -> np.ndarray:
    return rng.integers(0, 256, size=[height, width, channels], dtype=np.uint8)

def write_file(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'wb') as f:
        f.write(data)

def make_image_folder(root: str, images: dict, labels: dict = None) -> None:
    """images: {relative name: pixels [H, W, C]}; labels: {relative name: class} written as dataset.json."""
    for name, pixels in images.items():
        write_file(os.path.join(root, *name.split('/')), png_bytes(pixels))
    if labels is not None:
        write_file(os.path.join(root, 'dataset.json'), json.dumps({'labels': [[name, label] for name, label in labels.items()]}).encode())

def run_tool(*args: str):
    return CliRunner().invoke(dataset_tool.main, list(args))

def read_output(dest: str) -> tuple[list[str], list[np.ndarray], object]:
    """(image names, pixels [H, W, C], labels of dataset.json) of a written zip or folder, read directly."""
    if dest.endswith('.zip'):
        with zipfile.ZipFile(dest) as archive:
            files = {name: archive.read(name) for name in archive.namelist()}
    else:
        files = {}
        for dirpath, _dirnames, filenames in os.walk(dest):
            for fname in filenames:
                with open(os.path.join(dirpath, fname), 'rb') as f:
                    files[os.path.relpath(os.path.join(dirpath, fname), dest).replace(os.sep, '/')] = f.read()
    labels = json.loads(files.pop('dataset.json'))['labels']
    names = sorted(files)
    pixels = []
    for name in names:
        array = np.asarray(PIL.Image.open(io.BytesIO(files[name])))
        pixels.append(array[:, :, np.newaxis] if array.ndim == 2 else array)
    return names, pixels, labels

def expected_names(count: int) -> list[str]:
    return [f'{idx // 1000:05d}/img{idx:08d}.png' for idx in range(count)]

#----------------------------------------------------------------------------
# Image folders and zips, round trip through the loader.

@pytest.mark.parametrize('channels', [1, 3])
@pytest.mark.parametrize('dest_name', ['out.zip', 'out'])
def test_image_folder_round_trip(tmp_path, channels, dest_name):
    rng = np.random.default_rng(channels)
    names = ['b/c/z.png', 'a/x.png', 'a/y.png', 'top.png']
    images = {name: random_pixels(rng, 8, 8, channels) for name in names}
    labels = {name: int(label) for name, label in zip(names, [3, 0, 7, 2])}
    make_image_folder(str(tmp_path / 'src'), images, labels)
    dest = str(tmp_path / dest_name)

    result = run_tool(f'--source={tmp_path / "src"}', f'--dest={dest}')
    assert result.exit_code == 0, result.output

    order = sorted(names)  # The tool takes images in sorted order of their relative paths.
    out_names, out_pixels, out_labels = read_output(dest)
    assert out_names == expected_names(len(names))
    assert out_labels == [[out_name, labels[name]] for out_name, name in zip(out_names, order)]
    for pixels, name in zip(out_pixels, order):
        np.testing.assert_array_equal(pixels, images[name])

    dataset = ImageFolderDataset(dest, use_labels=True)
    assert len(dataset) == len(names)
    assert dataset.image_shape == [channels, 8, 8]
    assert dataset.label_dim == 8
    for idx, name in enumerate(order):
        image, label = dataset[idx]
        np.testing.assert_array_equal(image, images[name].transpose(2, 0, 1))
        np.testing.assert_array_equal(label, np.eye(8, dtype=np.float32)[labels[name]])

def test_zip_source_without_labels(tmp_path):
    rng = np.random.default_rng(1)
    images = [random_pixels(rng, 4, 4, 3) for _ in range(3)]
    with zipfile.ZipFile(tmp_path / 'src.zip', 'w') as archive:
        for idx, pixels in enumerate(images):
            archive.writestr(f'dir/{idx}.png', png_bytes(pixels))
    result = run_tool(f'--source={tmp_path / "src.zip"}', f'--dest={tmp_path / "out"}')
    assert result.exit_code == 0, result.output
    names, pixels, labels = read_output(str(tmp_path / 'out'))
    assert names == expected_names(3) and labels is None
    for got, want in zip(pixels, images):
        np.testing.assert_array_equal(got, want)
    assert not ImageFolderDataset(str(tmp_path / 'out'), use_labels=True).has_labels

def test_drop_labels(tmp_path):
    rng = np.random.default_rng(5)
    images = {f'{idx}.png': random_pixels(rng, 4, 4, 1) for idx in range(3)}
    make_image_folder(str(tmp_path / 'src'), images, {f'{idx}.png': idx for idx in range(3)})
    for dest, flags in (('kept', ()), ('dropped', ('--drop-labels',))):
        result = run_tool(f'--source={tmp_path / "src"}', f'--dest={tmp_path / dest}', *flags)
        assert result.exit_code == 0, result.output
    _, kept_pixels, kept_labels = read_output(str(tmp_path / 'kept'))
    names, pixels, labels = read_output(str(tmp_path / 'dropped'))
    assert kept_labels is not None and labels is None and names == expected_names(3)
    for got, want in zip(pixels, kept_pixels):
        np.testing.assert_array_equal(got, want)
    assert not ImageFolderDataset(str(tmp_path / 'dropped'), use_labels=True).has_labels

def test_rebuild_is_byte_identical(tmp_path):
    rng = np.random.default_rng(2)
    make_image_folder(str(tmp_path / 'src'), {f'{idx}.png': random_pixels(rng, 4, 4, 1) for idx in range(3)}, {f'{idx}.png': idx for idx in range(3)})
    for dest in ('a.zip', 'b.zip'):
        assert run_tool(f'--source={tmp_path / "src"}', f'--dest={tmp_path / dest}').exit_code == 0
    assert (tmp_path / 'a.zip').read_bytes() == (tmp_path / 'b.zip').read_bytes()

def test_max_images(tmp_path):
    rng = np.random.default_rng(3)
    images = {f'{idx}.png': random_pixels(rng, 4, 4, 3) for idx in range(5)}
    make_image_folder(str(tmp_path / 'src'), images, {name: idx for idx, name in enumerate(images)})
    result = run_tool(f'--source={tmp_path / "src"}', f'--dest={tmp_path / "out.zip"}', '--max-images=2')
    assert result.exit_code == 0, result.output
    names, pixels, labels = read_output(str(tmp_path / 'out.zip'))
    assert names == expected_names(2)
    assert labels == [[names[0], 0], [names[1], 1]]
    np.testing.assert_array_equal(pixels[1], images['1.png'])

#----------------------------------------------------------------------------
# CIFAR-10 and STL-10 in their official formats.

def cifar_batch(rng: np.random.Generator, count: int) -> dict:
    return {b'batch_label': b'synthetic', b'labels': [int(x) for x in rng.integers(0, 10, count)],
        b'data': rng.integers(0, 256, size=[count, 3072], dtype=np.uint8), b'filenames': [b'x.png'] * count}

def make_cifar10(path: str, batches: dict) -> None:
    """cifar-10-python.tar.gz layout: cifar-10-batches-py/<batch> pickles (protocol 2, as the Python 2 originals)."""
    with tarfile.open(path, 'w:gz') as tar:
        for name, batch in batches.items():
            data = pickle.dumps(batch, protocol=2)
            info = tarfile.TarInfo(f'cifar-10-batches-py/{name}')
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

def cifar_pixels(row: np.ndarray) -> np.ndarray:
    """Pixel (y, x, c) of a CIFAR-10 row is byte c*1024 + y*32 + x."""
    y, x, c = np.meshgrid(np.arange(32), np.arange(32), np.arange(3), indexing='ij')
    return row[c * 1024 + y * 32 + x]

@pytest.mark.parametrize('subset', ['train', 'test'])
def test_cifar10(tmp_path, subset):
    rng = np.random.default_rng(4)
    batches = {'batches.meta': {b'label_names': [b'airplane'] * 10}}
    batches.update({f'data_batch_{i}': cifar_batch(rng, 2) for i in range(1, 6)})
    batches['test_batch'] = cifar_batch(rng, 3)
    make_cifar10(str(tmp_path / 'cifar-10-python.tar.gz'), batches)
    result = run_tool(f'--source={tmp_path / "cifar-10-python.tar.gz"}', f'--dest={tmp_path / "out.zip"}', f'--subset={subset}')
    assert result.exit_code == 0, result.output

    used = [batches[f'data_batch_{i}'] for i in range(1, 6)] if subset == 'train' else [batches['test_batch']]
    rows = np.concatenate([batch[b'data'] for batch in used])
    classes = sum((batch[b'labels'] for batch in used), [])
    names, pixels, labels = read_output(str(tmp_path / 'out.zip'))
    assert len(names) == len(rows) == (10 if subset == 'train' else 3)
    assert [label for _name, label in labels] == classes
    for got, row in zip(pixels, rows):
        np.testing.assert_array_equal(got, cifar_pixels(row))

def test_cifar10_refuses_code_in_pickle(tmp_path):
    class RunsCode:
        def __reduce__(self):
            return (os.makedirs, (str(tmp_path / 'pwned'),))
    batches = {f'data_batch_{i}': cifar_batch(np.random.default_rng(i), 1) for i in range(1, 6)}
    batches['data_batch_1'][b'labels'] = RunsCode()
    make_cifar10(str(tmp_path / 'cifar-10-python.tar.gz'), batches)
    result = run_tool(f'--source={tmp_path / "cifar-10-python.tar.gz"}', f'--dest={tmp_path / "out.zip"}')
    assert result.exit_code != 0
    assert 'refusing to load' in result.output and 'Traceback' not in result.output
    assert not (tmp_path / 'pwned').exists() and not (tmp_path / 'out.zip').exists()

class Reduces:
    """Pickles as a call of `function` on `args`, then `state` set on the result (BUILD), as a hostile batch would."""

    def __init__(self, function, args: tuple, state=None) -> None:
        self.reduced = (function, args) if state is None else (function, args, state)

    def __reduce__(self):
        return self.reduced

@pytest.mark.parametrize('case', ['memo bomb', 'object array', 'array reconstructed large', 'codec', 'too many opcodes'])
def test_cifar10_batch_pickles_are_read_within_the_bound(tmp_path, monkeypatch, case):
    """What a batch's pickle may build: only plain arrays of the bytes it carries, within bounded_read.check_pickle."""
    batches = {f'data_batch_{i}': pickle.dumps(cifar_batch(np.random.default_rng(i), 2), protocol=2) for i in range(1, 6)}
    if case == 'memo bomb':  # 9 bytes that take the C unpickler 512 MiB.
        batches['data_batch_1'], reason = hostile_cases.memo_bomb_pickle(512 << 20), 'the pickle stores memo entry 33554432 after 0'
    elif case == 'object array':  # A full list: numpy would make it; a short one would crash the process.
        batch = cifar_batch(np.random.default_rng(1), 2)
        batch[b'data'] = Reduces(hostile_cases._reconstruct(), (np.ndarray, (0,), b'b'), (1, (2,), np.dtype(object), False, [1, 2]))
        batches['data_batch_1'], reason = pickle.dumps(batch, protocol=2), 'refusing an array that is not plain data of its declared size'
    elif case == 'array reconstructed large':  # 8 TB of address space asked for by a few bytes.
        batch = cifar_batch(np.random.default_rng(1), 2)
        batch[b'data'] = Reduces(hostile_cases._reconstruct(), (np.ndarray, (1 << 43,), b'b'))
        batches['data_batch_1'], reason = pickle.dumps(batch, protocol=2), 'refusing to reconstruct anything but an empty array'
    elif case == 'codec':
        batch = cifar_batch(np.random.default_rng(1), 2)
        batch[b'batch_label'] = Reduces(codecs.encode, ('x' * 10, 'utf-32'))
        batches['data_batch_1'], reason = pickle.dumps(batch, protocol=2), 'refusing _codecs.encode but of text to Latin-1'
    else:
        monkeypatch.setattr(bounded_read, 'MAX_PICKLE_OPCODES', 40)
        reason = 'refused to read: a pickle of more than 40 opcodes'
    path = tmp_path / 'cifar-10-python.tar.gz'
    path.write_bytes(hostile_cases.cifar_tar_gz(batches))
    result = run_tool(f'--source={path}', f'--dest={tmp_path / "out.zip"}')
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1 and reason in result.output, result.output
    assert 'cifar-10-batches-py/data_batch_1' in result.output and not (tmp_path / 'out.zip').exists()

def stl10_pixels(raw: bytes, idx: int) -> np.ndarray:
    """Pixel (y, x, c) of STL-10 image idx is byte idx*27648 + c*9216 + x*96 + y (column-major channels)."""
    y, x, c = np.meshgrid(np.arange(96), np.arange(96), np.arange(3), indexing='ij')
    return np.frombuffer(raw, dtype=np.uint8)[idx * 27648 + c * 9216 + x * 96 + y]

@pytest.mark.parametrize('packed', [True, False], ids=['tar.gz', 'folder'])
@pytest.mark.parametrize('subset', ['unlabeled', 'train'])
def test_stl10(tmp_path, packed, subset):
    rng = np.random.default_rng(5)
    files = {
        'unlabeled_X.bin': rng.integers(0, 256, 2 * 27648, dtype=np.uint8).tobytes(),
        'train_X.bin': rng.integers(0, 256, 3 * 27648, dtype=np.uint8).tobytes(),
        'train_y.bin': bytes([10, 1, 4]),
    }
    for name, data in files.items():
        write_file(str(tmp_path / 'stl10_binary' / name), data)
    source = tmp_path / 'stl10_binary'
    if packed:
        source = tmp_path / 'stl10_binary.tar.gz'
        with tarfile.open(source, 'w:gz') as tar:
            tar.add(tmp_path / 'stl10_binary', arcname='stl10_binary')
    args = [f'--source={source}', f'--dest={tmp_path / "out.zip"}'] + ([] if subset == 'unlabeled' else [f'--subset={subset}'])
    result = run_tool(*args)
    assert result.exit_code == 0, result.output

    names, pixels, labels = read_output(str(tmp_path / 'out.zip'))
    raw = files[f'{subset}_X.bin']
    assert len(names) == len(raw) // 27648
    for idx, got in enumerate(pixels):
        assert got.shape == (96, 96, 3)
        np.testing.assert_array_equal(got, stl10_pixels(raw, idx))
    if subset == 'unlabeled':
        assert labels is None
    else:
        assert [label for _name, label in labels] == [9, 0, 3]

def test_stl10_resized_to_48(tmp_path):
    """STL-10 is trained at 48x48: a constant image stays constant, at the new size."""
    raw = np.repeat(np.array([10, 100, 200], dtype=np.uint8), 96 * 96).tobytes()
    write_file(str(tmp_path / 'stl' / 'unlabeled_X.bin'), raw)
    result = run_tool(f'--source={tmp_path / "stl"}', f'--dest={tmp_path / "out.zip"}', '--resolution=48x48')
    assert result.exit_code == 0, result.output
    _names, pixels, _labels = read_output(str(tmp_path / 'out.zip'))
    np.testing.assert_array_equal(pixels[0], np.broadcast_to(np.array([10, 100, 200], dtype=np.uint8), [48, 48, 3]))

#----------------------------------------------------------------------------
# LSUN lmdb.

def test_lmdb(tmp_path):
    lmdb = pytest.importorskip('lmdb')
    rng = np.random.default_rng(6)
    images = [random_pixels(rng, 8, 8, 3) for _ in range(3)]
    env = lmdb.open(str(tmp_path / 'church_lmdb'), map_size=1 << 20)
    with env.begin(write=True) as txn:
        for idx, pixels in enumerate(images):
            buffer = io.BytesIO()
            PIL.Image.fromarray(pixels).save(buffer, format='webp', lossless=True)  # LSUN stores webp.
            txn.put(f'key{idx}'.encode(), buffer.getvalue())
    env.close()
    result = run_tool(f'--source={tmp_path / "church_lmdb"}', f'--dest={tmp_path / "out.zip"}', '--max-images=2')
    assert result.exit_code == 0, result.output
    names, pixels, labels = read_output(str(tmp_path / 'out.zip'))
    assert names == expected_names(2) and labels is None
    for got, want in zip(pixels, images):
        np.testing.assert_array_equal(got, want)

def test_lmdb_is_read_from_its_file_as_lmdb_wrote_it(tmp_path, monkeypatch):
    """bounded_read.LmdbDatabase against the lmdb package on a tree three levels deep: values inline and on overflow
    pages, keys of every length, pages freed by deletions; the tool then reads it without the package."""
    lmdb = pytest.importorskip('lmdb')
    rng = np.random.default_rng(7)
    env = lmdb.open(str(tmp_path / 'db'), map_size=1 << 28)
    with env.begin(write=True) as txn:
        for idx in range(6000):
            txn.put(rng.bytes(int(rng.integers(1, 60))), rng.bytes(int(rng.choice([0, 7, 900, 3000, 9000]))))
    with env.begin(write=True) as txn:
        for key in [key for idx, (key, _value) in enumerate(txn.cursor()) if idx % 3 == 0]:
            txn.delete(key)
    with env.begin() as txn:
        expected, stat = list(txn.cursor()), txn.stat()
    env.close()
    assert stat['depth'] == 3 and stat['overflow_pages'] > 0
    with bounded_read.LmdbDatabase(str(tmp_path / 'db')) as database:
        assert database.num_entries == len(expected) and list(database.entries()) == expected
        assert list(database.entries(max_entries=5)) == expected[:5]

    images = [random_pixels(rng, 8, 8, 3) for _ in range(2)]
    env = lmdb.open(str(tmp_path / 'church_lmdb'), map_size=1 << 20)
    with env.begin(write=True) as txn:
        for idx, pixels in enumerate(images):
            txn.put(f'key{idx}'.encode(), png_bytes(pixels))
    env.close()
    monkeypatch.setitem(sys.modules, 'lmdb', None)  # Makes `import lmdb` fail.
    result = run_tool(f'--source={tmp_path / "church_lmdb"}', f'--dest={tmp_path / "out.zip"}')
    assert result.exit_code == 0, result.output
    np.testing.assert_array_equal(read_output(str(tmp_path / 'out.zip'))[1], images)

@pytest.mark.parametrize('case', ['entry claiming 3 GiB', 'truncated', 'not lmdb'])
def test_lmdb_refusals(tmp_path, case):
    """A value claiming more than data.mdb holds (the lmdb package would touch it: SIGBUS), a copy cut short, a
    data.mdb that is something else: one line each, nothing written."""
    pytest.importorskip('lmdb')
    folder = str(tmp_path / 'db')
    os.makedirs(folder)
    if case == 'entry claiming 3 GiB':
        hostile_cases.lmdb_claiming(folder, 3 << 30)
        reason = 'refused to read: entry b claims 3,221,225,472 bytes at byte '
    elif case == 'truncated':
        hostile_cases.lmdb_truncated(folder)
        reason = 'refused to read: its pages reach byte 1,064,960 of data.mdb, which holds 65,536 (truncated?)'
    else:
        write_file(os.path.join(folder, 'data.mdb'), bytes(16384))
        reason = 'not an LMDB database (no LMDB meta page at offset 0)'
    result = run_tool(f'--source={folder}', f'--dest={tmp_path / "out.zip"}')
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith(f'Error: {folder}: {reason}'), result.output
    assert not (tmp_path / 'out.zip').exists()

#----------------------------------------------------------------------------
# Resolution and transforms.

def convert_one(tmp_path, pixels: np.ndarray, *args: str) -> np.ndarray:
    make_image_folder(str(tmp_path / 'src'), {'img.png': pixels})
    result = run_tool(f'--source={tmp_path / "src"}', f'--dest={tmp_path / "out.zip"}', *args)
    assert result.exit_code == 0, result.output
    return read_output(str(tmp_path / 'out.zip'))[1][0]

def test_center_crop_wide_source(tmp_path):
    pixels = random_pixels(np.random.default_rng(7), 6, 10, 3)
    out = convert_one(tmp_path, pixels, '--resolution=6x6', '--transform=center-crop')
    np.testing.assert_array_equal(out, pixels[:, 2:8])

def test_center_crop_tall_source(tmp_path):
    pixels = random_pixels(np.random.default_rng(8), 10, 6, 1)
    out = convert_one(tmp_path, pixels, '--resolution=6x6', '--transform=center-crop')
    np.testing.assert_array_equal(out, pixels[2:8])

def test_center_crop_resizes(tmp_path):
    pixels = np.zeros([6, 10, 3], dtype=np.uint8)
    pixels[:, 2:8] = [30, 60, 90]  # Only the centered square is colored.
    out = convert_one(tmp_path, pixels, '--resolution=4x4', '--transform=center-crop')
    np.testing.assert_array_equal(out, np.broadcast_to(np.array([30, 60, 90], dtype=np.uint8), [4, 4, 3]))

def test_squash_keeps_the_whole_image_and_resizes_bilinearly(tmp_path):
    # The authors' LSUN preprocessing: the whole 8x16 image squashed to 8x8. Halving the width with PIL's antialiased
    # bilinear is a triangle of half-width 2 source pixels around each output centre 2x + 1: taps 2x-1 .. 2x+2 with
    # weights 1, 3, 3, 1 (/ 8), those outside the image dropped and the rest renormalized. Rows stay as they are.
    pixels = random_pixels(np.random.default_rng(10), 8, 16, 3)
    out = convert_one(tmp_path, pixels, '--resolution=8x8', '--transform=squash')
    source = pixels.astype(np.float64)
    expected = np.zeros([8, 8, 3])
    for x in range(8):
        taps = [(j, w) for j, w in zip(range(2 * x - 1, 2 * x + 3), (1, 3, 3, 1)) if 0 <= j < 16]
        expected[:, x] = sum(w * source[:, j] for j, w in taps) / sum(w for _, w in taps)
    assert np.abs(out.astype(np.float64) - expected).max() <= 1  # PIL's fixed-point rounding.

def test_center_crop_wide(tmp_path):
    pixels = random_pixels(np.random.default_rng(9), 10, 12, 3)
    out = convert_one(tmp_path, pixels, '--resolution=12x8', '--transform=center-crop-wide')
    expected = np.zeros([12, 12, 3], dtype=np.uint8)
    expected[2:10] = pixels[1:9]  # 12x8 crop from the middle rows, centered in a black 12x12 square.
    np.testing.assert_array_equal(out, expected)

def test_celebahq_1024_and_downscaled(tmp_path):
    """A CelebA-HQ-like folder of 1024x1024 images, kept as is and downscaled to 256x256."""
    y, x = np.meshgrid(np.arange(1024), np.arange(1024), indexing='ij')
    images = {f'{idx:05d}.jpg.png': np.stack([x // 4, y // 4, (x + y) // 8], axis=2).astype(np.uint8) for idx in range(2)}
    make_image_folder(str(tmp_path / 'celeba-hq'), images)

    assert run_tool(f'--source={tmp_path / "celeba-hq"}', f'--dest={tmp_path / "full.zip"}').exit_code == 0
    full = ImageFolderDataset(str(tmp_path / 'full.zip'), resolution=1024)
    np.testing.assert_array_equal(full[1][0], images['00001.jpg.png'].transpose(2, 0, 1))

    result = run_tool(f'--source={tmp_path / "celeba-hq"}', f'--dest={tmp_path / "256.zip"}', '--resolution=256x256')
    assert result.exit_code == 0, result.output
    small = ImageFolderDataset(str(tmp_path / '256.zip'), resolution=256)
    assert len(small) == 2 and small.image_shape == [3, 256, 256]
    # A symmetric filter keeps a linear ramp linear: away from the borders each output pixel is its 4x4 block's mean.
    block_mean = images['00000.jpg.png'].astype(np.float64).reshape(256, 4, 256, 4, 3).mean(axis=(1, 3)).transpose(2, 0, 1)
    interior = (slice(None), slice(8, -8), slice(8, -8))
    assert np.abs(small[0][0][interior] - block_mean[interior]).max() <= 1.0

def test_resolution_resizes_mixed_sizes(tmp_path):
    make_image_folder(str(tmp_path / 'src'), {'a.png': np.full([8, 8, 1], 40, np.uint8), 'b.png': np.full([16, 16, 1], 200, np.uint8)})
    result = run_tool(f'--source={tmp_path / "src"}', f'--dest={tmp_path / "out.zip"}', '--resolution=4')
    assert result.exit_code == 0, result.output
    _names, pixels, _labels = read_output(str(tmp_path / 'out.zip'))
    np.testing.assert_array_equal(pixels[0], np.full([4, 4, 1], 40, np.uint8))
    np.testing.assert_array_equal(pixels[1], np.full([4, 4, 1], 200, np.uint8))

def test_resolution_resizes_with_lanczos_by_default(tmp_path):
    # StyleGAN2-ADA's dataset_tool: PIL's Lanczos. On random pixels every filter gives other values; equal to PIL's
    # own Lanczos resize of the source, and not to its bicubic or bilinear one.
    pixels = random_pixels(np.random.default_rng(11), 16, 16, 3)
    out = convert_one(tmp_path, pixels, '--resolution=8x8')
    image = PIL.Image.fromarray(pixels)
    np.testing.assert_array_equal(out, np.asarray(image.resize((8, 8), PIL.Image.Resampling.LANCZOS)))
    for other in (PIL.Image.Resampling.BICUBIC, PIL.Image.Resampling.BILINEAR):
        assert not np.array_equal(out, np.asarray(image.resize((8, 8), other)))

#----------------------------------------------------------------------------
# Bad input: a non-zero exit, one clear line, no traceback, nothing left behind.

def corrupt_bytes(_pixels: np.ndarray) -> bytes:
    return b'this is not an image'

def truncated_png(pixels: np.ndarray) -> bytes:
    data = png_bytes(pixels)
    return data[: len(data) // 2]

def write_bad_folder(root: str, case: str) -> str:
    """A source folder for one bad-input case; returns a text the error message must contain."""
    rng = np.random.default_rng(10)
    good = {f'{idx}.png': random_pixels(rng, 8, 8, 3) for idx in range(3)}
    if case in ('corrupt', 'truncated'):
        make_image_folder(root, good)
        write_file(os.path.join(root, '1.png'), (corrupt_bytes if case == 'corrupt' else truncated_png)(good['1.png']))
        return '1.png'
    if case == 'mixed-sizes':
        make_image_folder(root, dict(good, **{'2.png': random_pixels(rng, 16, 16, 3)}))
        return 'use --resolution'
    if case == 'mixed-channels':
        make_image_folder(root, dict(good, **{'2.png': random_pixels(rng, 8, 8, 1)}))
        return 'channel'
    if case == 'non-square':
        make_image_folder(root, {'0.png': random_pixels(rng, 8, 6, 3)})
        return 'must be square'
    if case == 'missing-label':
        make_image_folder(root, good, {'0.png': 1, '2.png': 0})
        return 'no label for 1.png'
    if case == 'bad-dataset-json':
        make_image_folder(root, good)
        write_file(os.path.join(root, 'dataset.json'), b'{"labels": [["0.png", "cat"]]}')
        return 'dataset.json'
    if case in ('16-bit-rgb', '16-bit-gray'):
        make_image_folder(root, good)
        write_file(os.path.join(root, '1.png'), png16_bytes(8, 3 if case == '16-bit-rgb' else 1))
        return '1.png: 16-bit'
    if case == 'no-images':
        write_file(os.path.join(root, 'notes.txt'), b'hello')
        return 'no images'
    raise ValueError(case)

BAD_FOLDER_CASES = ['corrupt', 'truncated', 'mixed-sizes', 'mixed-channels', 'non-square', 'missing-label', 'bad-dataset-json', 'no-images',
                    '16-bit-rgb', '16-bit-gray']

def assert_clean_failure(result, message: str, out_dir) -> None:
    assert result.exit_code not in (0, None), result.output
    assert isinstance(result.exception, SystemExit)
    assert 'Traceback' not in result.output
    error_lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(error_lines) == 1 and error_lines[0].startswith('Error: '), result.output
    assert message in error_lines[0]
    assert os.listdir(out_dir) == []  # No dataset, no temporary file.

@pytest.mark.parametrize('dest_name', ['ds.zip', 'ds'])
@pytest.mark.parametrize('case', BAD_FOLDER_CASES)
def test_bad_image_folder(tmp_path, case, dest_name):
    message = write_bad_folder(str(tmp_path / 'src'), case)
    (tmp_path / 'out').mkdir()
    result = run_tool(f'--source={tmp_path / "src"}', f'--dest={tmp_path / "out" / dest_name}')
    assert_clean_failure(result, message, tmp_path / 'out')

@pytest.mark.parametrize('dest_name', ['ds.zip', 'ds'])
def test_destination_exists_and_not_empty(tmp_path, dest_name):
    make_image_folder(str(tmp_path / 'src'), {'0.png': np.zeros([4, 4, 3], np.uint8)})
    dest = tmp_path / dest_name
    if dest_name.endswith('.zip'):
        dest.write_bytes(b'precious')
    else:
        write_file(str(dest / 'precious.txt'), b'precious')
    result = run_tool(f'--source={tmp_path / "src"}', f'--dest={dest}')
    assert result.exit_code != 0 and 'already exists' in result.output and 'Traceback' not in result.output
    assert (dest.read_bytes() if dest_name.endswith('.zip') else (dest / 'precious.txt').read_bytes()) == b'precious'
    assert sorted(os.listdir(tmp_path)) == sorted(['src', dest_name])

def test_empty_destination_folder_is_used(tmp_path):
    make_image_folder(str(tmp_path / 'src'), {'0.png': np.zeros([4, 4, 3], np.uint8)})
    (tmp_path / 'out').mkdir()
    assert run_tool(f'--source={tmp_path / "src"}', f'--dest={tmp_path / "out"}').exit_code == 0
    assert read_output(str(tmp_path / 'out'))[0] == expected_names(1)

@pytest.mark.parametrize('case', ['missing', 'text-file', 'other-tar', '--subset on a folder', 'crop without resolution'])
def test_bad_source_or_options(tmp_path, case):
    make_image_folder(str(tmp_path / 'images'), {'0.png': np.zeros([4, 4, 3], np.uint8)})
    source, extra, message = str(tmp_path / 'images'), [], None
    if case == 'missing':
        source, message = str(tmp_path / 'nowhere'), 'does not exist'
    elif case == 'text-file':
        source, message = str(tmp_path / 'notes.txt'), 'unknown source format'
        write_file(source, b'hello')
    elif case == 'other-tar':
        source, message = str(tmp_path / 'other.tar.gz'), 'unknown source format'
        with tarfile.open(source, 'w:gz') as tar:
            tar.add(tmp_path / 'images', arcname='images')
    elif case == '--subset on a folder':
        extra, message = ['--subset=test'], '--subset applies only'
    elif case == 'crop without resolution':
        extra, message = ['--transform=center-crop'], 'needs --resolution'
    (tmp_path / 'out').mkdir()
    result = run_tool(f'--source={source}', f'--dest={tmp_path / "out" / "ds.zip"}', *extra)
    assert_clean_failure(result, message, tmp_path / 'out')

def test_error_from_a_real_process(tmp_path):
    """Exit status and stderr as a shell sees them: one line naming the bad file, no traceback."""
    write_bad_folder(str(tmp_path / 'src'), 'corrupt')
    (tmp_path / 'out').mkdir()
    proc = subprocess.run([sys.executable, os.path.join(REPO_ROOT, 'dataset_tool.py'), f'--source={tmp_path / "src"}', f'--dest={tmp_path / "out" / "ds.zip"}'],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [f'Error: cannot read image {tmp_path / "src" / "1.png"}: not an image, or a format Pillow cannot read']
    assert os.listdir(tmp_path / 'out') == []

def test_16_bit_rgb_png_is_refused_not_truncated(tmp_path):
    """Pillow opens a 16-bit RGB PNG as 8-bit RGB (dropping the low byte); the tool refuses it as it refuses 16-bit gray."""
    write_file(str(tmp_path / 'src' / '0.png'), png16_bytes(4, 3))
    assert PIL.Image.open(tmp_path / 'src' / '0.png').mode == 'RGB'
    (tmp_path / 'out').mkdir()
    assert_clean_failure(run_tool(f'--source={tmp_path / "src"}', f'--dest={tmp_path / "out" / "ds.zip"}'), '16-bit', tmp_path / 'out')

def fail_after(func, count: int):
    """func, failing with ENOSPC (disk full) from its (count+1)-th call on, before writing anything."""
    calls = []

    def wrapper(*args, **kwargs):
        calls.append(args)
        if len(calls) > count:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return func(*args, **kwargs)
    return wrapper

@pytest.mark.parametrize('dest_name', ['ds.zip', 'ds'])
@pytest.mark.parametrize('after', [0, 2])
def test_full_disk_leaves_nothing(tmp_path, monkeypatch, dest_name, after):
    """Disk full while writing (simulated: the zip writer, or the folder writer's open(), fails with
    ENOSPC): one line, and neither the dataset, its temporary file, nor the directories made for it remain."""
    if dest_name.endswith('.zip'):
        monkeypatch.setattr(zipfile.ZipFile, 'writestr', fail_after(zipfile.ZipFile.writestr, after))
    else:
        monkeypatch.setattr(dataset_tool, 'open', fail_after(open, after), raising=False)
    make_image_folder(str(tmp_path / 'src'), {f'{i}.png': np.zeros([4, 4, 3], np.uint8) for i in range(4)})
    (tmp_path / 'out').mkdir()
    result = run_tool(f'--source={tmp_path / "src"}', f'--dest={tmp_path / "out" / "new" / "sub" / dest_name}')
    assert_clean_failure(result, 'No space left on device', tmp_path / 'out')

def test_destination_inside_a_file(tmp_path):
    make_image_folder(str(tmp_path / 'src'), {'0.png': np.zeros([4, 4, 3], np.uint8)})
    write_file(str(tmp_path / 'out' / 'file'), b'precious')
    result = run_tool(f'--source={tmp_path / "src"}', f'--dest={tmp_path / "out" / "file" / "ds.zip"}')
    assert result.exit_code != 0 and len(result.output.strip().splitlines()) == 1 and 'cannot write' in result.output
    assert os.listdir(tmp_path / 'out') == ['file'] and (tmp_path / 'out' / 'file').read_bytes() == b'precious'

@pytest.mark.parametrize('error', [errno.EACCES, errno.EROFS])
def test_unwritable_destination(tmp_path, monkeypatch, error):
    """A read-only directory or file system (simulated, since root may write anywhere): one line, nothing made."""
    def refuse(*args, **kwargs):
        raise OSError(error, os.strerror(error))
    monkeypatch.setattr(dataset_tool.tempfile, 'mkstemp', refuse)
    make_image_folder(str(tmp_path / 'src'), {'0.png': np.zeros([4, 4, 3], np.uint8)})
    (tmp_path / 'out').mkdir()
    result = run_tool(f'--source={tmp_path / "src"}', f'--dest={tmp_path / "out" / "new" / "ds.zip"}')
    assert_clean_failure(result, os.strerror(error), tmp_path / 'out')

#----------------------------------------------------------------------------
# Worker processes: the bytes of one process, whatever finishes first; refusals as in one process.

ORIGINAL_CONVERT = dataset_tool.convert

def unordered_convert(item: dataset_tool.SourceImage, transform: dataset_tool.Transform):
    """dataset_tool.convert, slowed for every third image (by the last number in its name: 0, 3, 6, ...), so that
    workers finish out of source order. Module level: the pool's workers find it by name."""
    if int(re.findall(r'\d+', item.name)[-1]) % 3 == 0:
        time.sleep(0.1)
    return ORIGINAL_CONVERT(item, transform)

def crashing_convert(item: dataset_tool.SourceImage, transform: dataset_tool.Transform):
    """dataset_tool.convert, but the worker dies (as the kernel's OOM killer would end it) at image 5."""
    if item.name.endswith('05.png'):
        os._exit(9)
    return ORIGINAL_CONVERT(item, transform)

def write_source(tmp_path, kind: str) -> tuple[str, list[str], int]:
    """A synthetic source of each kind the tool reads: (path, extra options, number of images)."""
    rng = np.random.default_rng(11)
    if kind in ('folder', 'folder to folder'):
        names = [f'{"ab"[idx % 2]}/{idx:02d}.png' for idx in range(12)]
        make_image_folder(str(tmp_path / 'src'), {name: random_pixels(rng, 8, 8, 3) for name in names}, {name: idx % 4 for idx, name in enumerate(names)})
        return str(tmp_path / 'src'), [], 12
    if kind == 'zip':
        with zipfile.ZipFile(tmp_path / 'src.zip', 'w') as archive:
            for idx in range(12):
                archive.writestr(f'dir/{idx:02d}.png', png_bytes(random_pixels(rng, 12, 12, 1)))
        return str(tmp_path / 'src.zip'), ['--resolution=8x8'], 12
    if kind == 'cifar10':
        batches = {f'data_batch_{i}': cifar_batch(rng, 3) for i in range(1, 6)}
        make_cifar10(str(tmp_path / 'cifar-10-python.tar.gz'), batches)
        return str(tmp_path / 'cifar-10-python.tar.gz'), [], 15
    if kind == 'stl10':
        write_file(str(tmp_path / 'stl10_binary' / 'train_X.bin'), rng.integers(0, 256, 9 * 27648, dtype=np.uint8).tobytes())
        write_file(str(tmp_path / 'stl10_binary' / 'train_y.bin'), bytes(rng.integers(1, 11, 9, dtype=np.uint8)))
        with tarfile.open(tmp_path / 'stl10_binary.tar.gz', 'w:gz') as tar:
            tar.add(tmp_path / 'stl10_binary', arcname='stl10_binary')
        return str(tmp_path / 'stl10_binary.tar.gz'), ['--subset=train', '--resolution=48x48'], 9
    if kind == 'lsun lmdb':
        lmdb = pytest.importorskip('lmdb')
        env = lmdb.open(str(tmp_path / 'church_outdoor_train_lmdb'), map_size=1 << 22)
        with env.begin(write=True) as txn:
            for idx in range(12):
                buffer = io.BytesIO()
                PIL.Image.fromarray(random_pixels(rng, 12, 16, 3)).save(buffer, format='webp', quality=80)  # LSUN: lossy WebP.
                txn.put(f'{idx:02d}'.encode(), buffer.getvalue())
        env.close()
        return str(tmp_path / 'church_outdoor_train_lmdb'), ['--resolution=8x8', '--transform=center-crop'], 12
    if kind == 'celeba-hq folder':
        make_image_folder(str(tmp_path / 'celeba-hq'), {f'{idx:05d}.jpg.png': random_pixels(rng, 64, 64, 3) for idx in range(10)})
        return str(tmp_path / 'celeba-hq'), ['--resolution=16x16'], 10
    raise ValueError(kind)

def read_tree(dest) -> dict[str, bytes]:
    return {os.path.relpath(os.path.join(dirpath, fname), dest): open(os.path.join(dirpath, fname), 'rb').read()
            for dirpath, _dirnames, filenames in os.walk(dest) for fname in filenames}

@pytest.mark.parametrize('kind', ['folder', 'folder to folder', 'zip', 'cifar10', 'stl10', 'lsun lmdb', 'celeba-hq folder'])
def test_workers_write_the_bytes_of_one_process(tmp_path, monkeypatch, kind):
    """Three workers, which finish out of order (every third image is slow), write the dataset of one process: the
    same archive byte for byte (names, labels, every PNG, the zip's own bytes), or the same files in a folder."""
    source, options, count = write_source(tmp_path, kind)
    monkeypatch.setattr(dataset_tool, 'convert', unordered_convert)
    dests = {workers: str(tmp_path / (f'w{workers}' if kind == 'folder to folder' else f'w{workers}.zip')) for workers in (1, 3)}
    for workers, dest in dests.items():
        result = run_tool(f'--source={source}', f'--dest={dest}', f'--workers={workers}', *options)
        assert result.exit_code == 0, result.output
    names, _pixels, _labels = read_output(dests[1])
    assert names == expected_names(count)
    if kind == 'folder to folder':
        assert read_tree(dests[3]) == read_tree(dests[1])
    else:
        assert open(dests[3], 'rb').read() == open(dests[1], 'rb').read()

_children_before_the_test: set[int] = set()


@pytest.fixture(autouse=True)
def _children_of_earlier_tests():
    """The processes this test process had before the test (DataLoader workers and trackers of earlier tests in the
    same process), which assert_no_workers_left leaves out."""
    _children_before_the_test.clear()
    _children_before_the_test.update(p.pid for p in psutil.Process().children(recursive=True))
    yield


def assert_no_workers_left() -> None:
    children = [p for p in psutil.Process().children(recursive=True) if p.pid not in _children_before_the_test]
    assert children == [], children

def test_refusal_inside_a_worker(tmp_path, monkeypatch):
    """Three bad images: 03 not an image (its worker slowed), 04 truncated (converted first), 05 a link to nowhere (an
    error of the main process, which reads ahead of the writer): the error is the one a single process reports, the
    first in source order, in one line; nothing is written and no worker is left."""
    rng = np.random.default_rng(12)
    make_image_folder(str(tmp_path / 'src'), {f'{idx:02d}.png': random_pixels(rng, 8, 8, 3) for idx in range(12)})
    write_file(str(tmp_path / 'src' / '03.png'), b'this is not an image')
    write_file(str(tmp_path / 'src' / '04.png'), truncated_png(random_pixels(rng, 8, 8, 3)))
    os.remove(tmp_path / 'src' / '05.png')
    os.symlink(tmp_path / 'nowhere.png', tmp_path / 'src' / '05.png')
    monkeypatch.setattr(dataset_tool, 'convert', unordered_convert)
    (tmp_path / 'out').mkdir()
    for workers in (1, 3):
        result = run_tool(f'--source={tmp_path / "src"}', f'--dest={tmp_path / "out" / "ds.zip"}', f'--workers={workers}')
        assert_clean_failure(result, f'cannot read image {tmp_path / "src" / "03.png"}: not an image', tmp_path / 'out')
        assert_no_workers_left()

def test_a_worker_that_dies(tmp_path, monkeypatch):
    rng = np.random.default_rng(13)
    make_image_folder(str(tmp_path / 'src'), {f'{idx:02d}.png': random_pixels(rng, 8, 8, 3) for idx in range(12)})
    monkeypatch.setattr(dataset_tool, 'convert', crashing_convert)
    (tmp_path / 'out').mkdir()
    result = run_tool(f'--source={tmp_path / "src"}', f'--dest={tmp_path / "out" / "ds.zip"}', '--workers=2')
    assert_clean_failure(result, 'a worker process ended unexpectedly', tmp_path / 'out')
    assert_no_workers_left()

def slow_convert(item: dataset_tool.SourceImage, transform: dataset_tool.Transform):
    time.sleep(0.2)
    return ORIGINAL_CONVERT(item, transform)

def slow_writestr(archive: zipfile.ZipFile, *args, original=zipfile.ZipFile.writestr) -> None:
    time.sleep(0.1)
    original(archive, *args)

SLOWED = {'busy workers': 'dataset_tool.convert = t.slow_convert', 'idle workers': 'zipfile.ZipFile.writestr = t.slow_writestr'}

def _sigint_as_in_a_terminal() -> None:
    """In the child before it runs: SIGINT at its default, not ignored as it is inherited when the tests were started in
    the background by a non-interactive shell."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)

@pytest.mark.parametrize('slowed', list(SLOWED))
def test_ctrl_c_stops_every_worker(tmp_path, slowed):
    """Ctrl-C in a terminal signals the whole process group, workers included, whether they are converting or waiting
    for the writer: one line ('Aborted!'), nothing written, no process of the group left, no worker's traceback."""
    rng = np.random.default_rng(14)
    make_image_folder(str(tmp_path / 'src'), {f'{idx:02d}.png': random_pixels(rng, 8, 8, 3) for idx in range(60)})
    (tmp_path / 'out').mkdir()
    script = (f'import sys, zipfile, dataset_tool, tests.test_dataset_tool as t; {SLOWED[slowed]}; '
              'sys.argv[0] = "dataset_tool.py"; dataset_tool.main()')
    proc = subprocess.Popen([sys.executable, '-c', script, f'--source={tmp_path / "src"}', f'--dest={tmp_path / "out" / "ds.zip"}', '--workers=2'],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_sigint_as_in_a_terminal)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (os.listdir(tmp_path / 'out') and len(psutil.Process(proc.pid).children()) == 2):
        time.sleep(0.05)
    time.sleep(1)  # Some images written, most to come (60 images, 0.2 s each, 2 workers).
    assert proc.poll() is None, proc.communicate()
    os.killpg(proc.pid, signal.SIGINT)
    _stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1 and stderr.strip().splitlines() == ['Aborted!'], stderr
    assert os.listdir(tmp_path / 'out') == []
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # Nothing of the group runs any more.

def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height RGB pixels (a decompression bomb's header), with no pixels after it."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, 'big') + kind + data + zlib.crc32(kind + data).to_bytes(4, 'big')
    header = width.to_bytes(4, 'big') + height.to_bytes(4, 'big') + bytes([8, 2, 0, 0, 0])
    return b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', header) + chunk(b'IDAT', zlib.compress(b'')) + chunk(b'IEND', b'')

def test_image_bomb_inside_a_worker(tmp_path):
    """An image claiming 10^10 pixels, met by a worker: refused by Pillow's pixel limit in one line, nothing written,
    and no worker left."""
    rng = np.random.default_rng(15)
    make_image_folder(str(tmp_path / 'src'), {f'{idx:02d}.png': random_pixels(rng, 8, 8, 3) for idx in range(6)})
    write_file(str(tmp_path / 'src' / '02.png'), png_claiming(100_000, 100_000))
    (tmp_path / 'out').mkdir()
    result = run_tool(f'--source={tmp_path / "src"}', f'--dest={tmp_path / "out" / "ds.zip"}', '--workers=2')
    assert_clean_failure(result, f'cannot read image {tmp_path / "src" / "02.png"}: Image size (10000000000 pixels) exceeds limit', tmp_path / 'out')
    assert_no_workers_left()

#----------------------------------------------------------------------------
# What the tool says: one closing line on success; a source of another aspect than --resolution refused, and each
# hint of the refusals followed through to a dataset.

CLOSING_LINE = re.compile(r'Wrote ([\d,]+) images? of (\d+)x(\d+) (RGB|grayscale), '
                          r'(labels of (\d+) classes|no labels), to (.+) \(([\d,]+) bytes\) in (\d+)s')

@pytest.mark.parametrize('dest_name', ['ds.zip', 'ds'])
def test_the_closing_line_says_what_was_written(tmp_path, dest_name):
    rng = np.random.default_rng(16)
    images = {f'{idx:02d}.png': random_pixels(rng, 8, 8, 1) for idx in range(5)}
    make_image_folder(str(tmp_path / 'src'), images, {name: [0, 3, 1, 3, 0][idx] for idx, name in enumerate(images)})
    dest = tmp_path / dest_name
    for extra, labels in (([], 'labels of 4 classes'), (['--drop-labels'], 'no labels')):  # Classes 0..3: one-hot of 4.
        result = run_tool(f'--source={tmp_path / "src"}', f'--dest={dest}', '--resolution=4', *extra)
        assert result.exit_code == 0, result.output
        lines = result.output.splitlines()
        assert len(lines) == 1, result.output
        match = CLOSING_LINE.fullmatch(lines[0])
        assert match is not None, lines[0]
        files = [os.path.join(dirpath, fname) for dirpath, _dirnames, fnames in os.walk(dest) for fname in fnames]
        size = os.path.getsize(dest) if dest_name.endswith('.zip') else sum(os.path.getsize(path) for path in files)
        assert match.group(1, 2, 3, 4, 5, 7) == ('5', '4', '4', 'grayscale', labels, str(dest))
        assert int(match.group(8).replace(',', '')) == size and int(match.group(9)) < 60
        remove_dataset(dest)

def remove_dataset(dest) -> None:
    if dest.is_dir():
        dataset_tool.remove(str(dest))
    else:
        dest.unlink()

def test_a_source_of_another_aspect_is_refused_and_a_transform_fits_it(tmp_path):
    """A 10x6 image and --resolution=6x6 without --transform: refused in one line naming the transforms (a plain resize
    would squash it), nothing written; each transform it names then writes a 6x6 image."""
    pixels = random_pixels(np.random.default_rng(17), 6, 10, 3)
    make_image_folder(str(tmp_path / 'src'), {'wide.png': pixels})
    (tmp_path / 'out').mkdir()
    result = run_tool(f'--source={tmp_path / "src"}', f'--dest={tmp_path / "out" / "ds.zip"}', '--resolution=6x6')
    assert_clean_failure(result, f'{tmp_path / "src" / "wide.png"} is 10x6, of another aspect than --resolution=6x6',
                         tmp_path / 'out')
    transforms = re.search(r'add --transform=(.+)$', result.output.strip()).group(1).replace(' or ', ', ').split(', ')
    assert sorted(transforms) == ['center-crop', 'center-crop-wide', 'squash']
    for transform in transforms:
        resolution = '10x6' if transform == 'center-crop-wide' else '6x6'  # Wide: all of it on a black 10x10 square.
        result = run_tool(f'--source={tmp_path / "src"}', f'--dest={tmp_path / "out" / "ds.zip"}',
                          f'--resolution={resolution}', f'--transform={transform}')
        assert result.exit_code == 0, result.output
        out = read_output(str(tmp_path / 'out' / 'ds.zip'))[1][0]
        assert out.shape == ((10, 10, 3) if transform == 'center-crop-wide' else (6, 6, 3))
        if transform == 'center-crop':
            np.testing.assert_array_equal(out, pixels[:, 2:8])
        (tmp_path / 'out' / 'ds.zip').unlink()

def test_a_source_of_the_same_aspect_is_resized_without_a_transform(tmp_path):
    """16x8 to --resolution=8x4 keeps the aspect: resized, then refused only because the output is not square, with a
    hint whose two ways each write a square image: the 8x4 image on a black 8x8 square, or its centered square."""
    make_image_folder(str(tmp_path / 'src'), {'wide.png': np.full([8, 16, 1], 120, np.uint8)})
    (tmp_path / 'out').mkdir()
    result = run_tool(f'--source={tmp_path / "src"}', f'--dest={tmp_path / "out" / "ds.zip"}', '--resolution=8x4')
    assert_clean_failure(result, 'is 8x4 but images must be square; use --transform=center-crop-wide, '
                                 'or a square --resolution with --transform=center-crop', tmp_path / 'out')
    on_black = np.zeros([8, 8, 1], np.uint8)
    on_black[2:6] = 120  # The middle 4 rows.
    for hint, expected in ((['--resolution=8x4', '--transform=center-crop-wide'], on_black),
                           (['--resolution=4x4', '--transform=center-crop'], np.full([4, 4, 1], 120, np.uint8))):
        result = run_tool(f'--source={tmp_path / "src"}', f'--dest={tmp_path / "out" / "ds.zip"}', *hint)
        assert result.exit_code == 0, result.output
        np.testing.assert_array_equal(read_output(str(tmp_path / 'out' / 'ds.zip'))[1][0], expected)
        (tmp_path / 'out' / 'ds.zip').unlink()
