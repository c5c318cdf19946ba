"""training/data/dataset.py: lazy reads, labels, x-flips, subsets, checks, DataLoader workers, pickling.

Datasets are written here with zipfile and PIL directly in the documented
format, so the loader is checked against the format and not against itself.
"""

import importlib
import importlib.util
import io
import json
import os
import pickle
import re
import zipfile

import numpy as np
import PIL.Image
import pytest
import torch
from click.testing import CliRunner

import dataset_tool
import training.data.dataset
from tests.support.images import png16_bytes, png_bytes
from torch_utils import bounded_read
from training.data.dataset import DatasetError, ImageFolderDataset

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def make_dataset(path: str, images: list, labels: list = None, replace: dict = None) -> list[str]:
    """Write images [H, W, C] as dataset_tool names them, to a zip (path ends in .zip) or a folder.

    labels: class per image for dataset.json (None: {"labels": null}); replace: {name: raw bytes} overrides.
    Returns the image names.
    """
    names = [f'{idx // 1000:05d}/img{idx:08d}.png' for idx in range(len(images))]
    files = {name: png_bytes(pixels) for name, pixels in zip(names, images)}
    files['dataset.json'] = json.dumps({'labels': None if labels is None else [[name, label] for name, label in zip(names, labels)]}).encode()
    files.update(replace or {})
    if path.endswith('.zip'):
        with zipfile.ZipFile(path, 'w') as archive:
            for name, data in files.items():
                archive.writestr(name, data)
    else:
        for name, data in files.items():
            os.makedirs(os.path.dirname(os.path.join(path, name)) or path, exist_ok=True)
            with open(os.path.join(path, name), 'wb') as f:
                f.write(data)
    return names

def random_images(count: int, size: int = 4, channels: int = 3, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=[size, size, channels], dtype=np.uint8) for _ in range(count)]

@pytest.mark.parametrize('channels', [1, 3])
@pytest.mark.parametrize('container', ['data.zip', 'data'])
def test_images_labels_and_properties(tmp_path, container, channels):
    images = random_images(5, size=8, channels=channels)
    classes = [4, 0, 2, 4, 1]
    make_dataset(str(tmp_path / container), images, classes)
    dataset = ImageFolderDataset(str(tmp_path / container), use_labels=True)
    assert len(dataset) == 5
    assert dataset.name == 'data'
    assert dataset.image_shape == [channels, 8, 8] and dataset.num_channels == channels and dataset.resolution == 8
    assert dataset.label_shape == [5] and dataset.label_dim == 5 and dataset.has_labels
    for idx in range(5):
        image, label = dataset[idx]
        assert image.dtype == np.uint8 and label.dtype == np.float32
        np.testing.assert_array_equal(image, images[idx].transpose(2, 0, 1))
        np.testing.assert_array_equal(label, np.eye(5, dtype=np.float32)[classes[idx]])
        np.testing.assert_array_equal(dataset.get_label(idx), label)

def test_without_labels(tmp_path):
    make_dataset(str(tmp_path / 'labeled.zip'), random_images(3), [0, 1, 2])
    make_dataset(str(tmp_path / 'unlabeled.zip'), random_images(3))
    for path, use_labels in [('labeled.zip', False), ('unlabeled.zip', True), ('unlabeled.zip', False)]:
        dataset = ImageFolderDataset(str(tmp_path / path), use_labels=use_labels)
        assert dataset.label_shape == [0] and dataset.label_dim == 0 and not dataset.has_labels
        assert dataset[1][1].shape == (0,)

def test_reads_lazily(tmp_path, monkeypatch):
    """Opening decodes one image; each item decodes its own; a corrupt image fails only when read."""
    images = random_images(4)
    names = make_dataset(str(tmp_path / 'data.zip'), images, replace={'00000/img00000003.png': b'not a png'})
    decoded = []
    real_open = PIL.Image.open
    monkeypatch.setattr(training.data.dataset.PIL.Image, 'open', lambda *args, **kwargs: decoded.append(1) or real_open(*args, **kwargs))
    dataset = ImageFolderDataset(str(tmp_path / 'data.zip'))
    assert len(decoded) == 1
    np.testing.assert_array_equal(dataset[2][0], images[2].transpose(2, 0, 1))
    assert len(decoded) == 2
    with pytest.raises(DatasetError, match=names[3]):
        dataset[3]

def test_xflip(tmp_path):
    images = random_images(3, size=6)
    make_dataset(str(tmp_path / 'data.zip'), images, [2, 0, 1])
    dataset = ImageFolderDataset(str(tmp_path / 'data.zip'), use_labels=True, xflip=True)
    assert len(dataset) == 6
    for idx in range(3):
        np.testing.assert_array_equal(dataset[idx][0], images[idx].transpose(2, 0, 1))
        mirrored, label = dataset[idx + 3]
        np.testing.assert_array_equal(mirrored, images[idx][:, ::-1].transpose(2, 0, 1))
        assert mirrored.flags['C_CONTIGUOUS']
        np.testing.assert_array_equal(label, dataset[idx][1])

def test_max_size_subset_is_deterministic(tmp_path):
    images = random_images(20)
    make_dataset(str(tmp_path / 'data.zip'), images, list(range(20)))
    path = str(tmp_path / 'data.zip')

    def classes(dataset) -> list[int]:
        return [int(dataset.get_label(idx).argmax()) for idx in range(len(dataset))]
    first = ImageFolderDataset(path, use_labels=True, max_size=5, random_seed=0)
    again = ImageFolderDataset(path, use_labels=True, max_size=5, random_seed=0)
    other = ImageFolderDataset(path, use_labels=True, max_size=5, random_seed=1)
    assert len(first) == 5 and classes(first) == classes(again) and classes(first) != classes(other)
    assert len(set(classes(first))) == 5
    for idx, cls in enumerate(classes(first)):  # Each item is the image that carries its label.
        np.testing.assert_array_equal(first[idx][0], images[cls].transpose(2, 0, 1))
    assert first.label_dim == 20  # Classes come from the whole dataset, not the subset.
    assert len(ImageFolderDataset(path, max_size=5, xflip=True)) == 10
    assert len(ImageFolderDataset(path, max_size=100)) == 20

def test_resolution_is_checked(tmp_path):
    make_dataset(str(tmp_path / 'data.zip'), random_images(2, size=8))
    assert ImageFolderDataset(str(tmp_path / 'data.zip'), resolution=8).resolution == 8
    with pytest.raises(DatasetError, match='resolution 8x8, not the expected 16x16'):
        ImageFolderDataset(str(tmp_path / 'data.zip'), resolution=16)

def test_non_power_of_two_square_is_accepted(tmp_path):
    """STL-10 trains at 48x48, so square is required but a power of two is not."""
    make_dataset(str(tmp_path / 'data.zip'), random_images(1, size=48))
    assert ImageFolderDataset(str(tmp_path / 'data.zip')).resolution == 48

@pytest.mark.parametrize('case', ['missing', 'not-a-dataset', 'empty', 'non-square', 'other-shape', 'missing-label', 'bad-label'])
def test_errors(tmp_path, case):
    path = str(tmp_path / 'data.zip')
    use_labels = case in ('missing-label', 'bad-label')
    message, read_index = None, None
    if case == 'missing':
        message = 'does not exist'
    elif case == 'not-a-dataset':
        (tmp_path / 'data.zip').write_bytes(b'hello')
        message = 'neither a zip archive nor a folder'
    elif case == 'empty':
        path = str(tmp_path / 'folder')
        os.makedirs(path)
        message = 'holds no images'
    elif case == 'non-square':
        make_dataset(path, [np.zeros([4, 6, 3], np.uint8)])
        message = 'must be square'
    elif case == 'other-shape':
        make_dataset(path, random_images(1) + random_images(1, size=8))
        message, read_index = 'unlike the first image', 1
    elif case == 'missing-label':
        make_dataset(path, random_images(2), replace={'dataset.json': b'{"labels": [["00000/img00000000.png", 1]]}'})
        message = 'no label for 00000/img00000001.png'
    elif case == 'bad-label':
        make_dataset(path, random_images(1), ['cat'])
        message = 'class indices'
    with pytest.raises(DatasetError, match=message):
        dataset = ImageFolderDataset(path, use_labels=use_labels)
        dataset[read_index]

def test_dataloader_workers(tmp_path):
    images = random_images(8)
    make_dataset(str(tmp_path / 'data.zip'), images, [idx % 3 for idx in range(8)])
    dataset = ImageFolderDataset(str(tmp_path / 'data.zip'), use_labels=True)
    dataset[0]  # The parent now holds an open handle; the workers must not share it.
    loader = torch.utils.data.DataLoader(dataset, batch_size=3, num_workers=2)
    batches = list(loader)
    got_images = torch.cat([batch[0] for batch in batches]).numpy()
    got_labels = torch.cat([batch[1] for batch in batches]).numpy()
    np.testing.assert_array_equal(got_images, np.stack([image.transpose(2, 0, 1) for image in images]))
    np.testing.assert_array_equal(got_labels, np.eye(3, dtype=np.float32)[[idx % 3 for idx in range(8)]])

def test_pickle_leaves_out_the_zip_handle(tmp_path):
    images = random_images(3)
    make_dataset(str(tmp_path / 'data.zip'), images)
    dataset = ImageFolderDataset(str(tmp_path / 'data.zip'))
    dataset[1]
    assert isinstance(dataset._zipfile, bounded_read.ZipArchive)
    data = pickle.dumps(dataset)  # An open ZipFile would not pickle at all.
    assert b'ZipFile' not in data and b'ZipArchive' not in data
    copy = pickle.loads(data)
    np.testing.assert_array_equal(copy[2][0], images[2].transpose(2, 0, 1))
    np.testing.assert_array_equal(dataset[2][0], images[2].transpose(2, 0, 1))

def test_new_process_opens_its_own_handle(tmp_path, monkeypatch):
    make_dataset(str(tmp_path / 'data.zip'), random_images(2))
    dataset = ImageFolderDataset(str(tmp_path / 'data.zip'))
    dataset[0]
    inherited = dataset._zipfile
    monkeypatch.setattr(os, 'getpid', lambda: -1)  # As seen from a forked child.
    dataset[1]
    assert dataset._zipfile is not inherited

def test_init_kwargs_rebuild_the_dataset(tmp_path):
    images = random_images(6)
    make_dataset(str(tmp_path / 'data.zip'), images, [0, 1, 2, 0, 1, 2])
    dataset = ImageFolderDataset(str(tmp_path / 'data.zip'), use_labels=True, max_size=4, xflip=True, random_seed=3)
    kwargs = dataset.init_kwargs
    assert type(kwargs) is dict and json.loads(json.dumps(kwargs)) == kwargs  # Plain data, safe in a snapshot.
    assert kwargs == dict(class_name='training.data.dataset.ImageFolderDataset', path=str(tmp_path / 'data.zip'), resolution=4,
        use_labels=True, max_size=4, xflip=True, random_seed=3)
    module_name, class_name = kwargs.pop('class_name').rsplit('.', 1)
    rebuilt = getattr(importlib.import_module(module_name), class_name)(**kwargs)
    assert len(rebuilt) == len(dataset) == 8
    for idx in range(len(dataset)):
        np.testing.assert_array_equal(rebuilt[idx][0], dataset[idx][0])
        np.testing.assert_array_equal(rebuilt[idx][1], dataset[idx][1])

#----------------------------------------------------------------------------
# The embedded quick-start dataset.

DIGITS_ZIP = os.path.join(REPO_ROOT, 'data', 'digits32.zip')
FIRST_DIGIT = np.array([  # sklearn.datasets.load_digits().images[0]
    [0, 0, 5, 13, 9, 1, 0, 0], [0, 0, 13, 15, 10, 15, 5, 0], [0, 3, 15, 2, 0, 11, 8, 0], [0, 4, 12, 0, 0, 8, 8, 0],
    [0, 5, 8, 0, 0, 9, 8, 0], [0, 4, 11, 0, 1, 12, 7, 0], [0, 2, 14, 5, 10, 12, 0, 0], [0, 0, 6, 13, 10, 0, 0, 0]])

def test_embedded_digits():
    dataset = ImageFolderDataset(DIGITS_ZIP, use_labels=True)
    assert len(dataset) == 1797 and dataset.image_shape == [1, 32, 32] and dataset.label_dim == 10
    counts = np.bincount([int(dataset.get_label(idx).argmax()) for idx in range(len(dataset))])
    assert counts.tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]  # Class sizes of scikit-learn's copy.
    # The first image, shrunk back to 8x8 by block means, is the source's first digit (a zero, 17 gray levels).
    levels = dataset[0][0][0].astype(np.float64).reshape(8, 4, 8, 4).mean(axis=(1, 3)) * 16 / 255
    assert np.corrcoef(levels.ravel(), FIRST_DIGIT.ravel())[0, 1] > 0.98
    assert np.abs(levels - FIRST_DIGIT).max() < 3
    assert os.path.getsize(DIGITS_ZIP) < 1_000_000

def test_embedded_digits_rebuild_byte_identical(tmp_path):
    """The commands in data/README.md give the committed archive (where scikit-learn is installed)."""
    pytest.importorskip('sklearn')
    spec = importlib.util.spec_from_file_location('make_digits', os.path.join(REPO_ROOT, 'data', 'make_digits.py'))
    make_digits = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_digits)
    runner = CliRunner()
    assert runner.invoke(make_digits.main, [f'--outdir={tmp_path / "digits"}']).exit_code == 0
    assert runner.invoke(dataset_tool.main, [f'--source={tmp_path / "digits"}', f'--dest={tmp_path / "digits32.zip"}']).exit_code == 0
    with open(DIGITS_ZIP, 'rb') as f:
        assert (tmp_path / 'digits32.zip').read_bytes() == f.read()


def palette_png_bytes(size: int, rgb: tuple) -> bytes:
    image = PIL.Image.new('P', (size, size), 1)
    image.putpalette([0, 0, 0, *rgb] + [0] * (256 - 2) * 3)
    buffer = io.BytesIO()
    image.save(buffer, format='png')
    return buffer.getvalue()

BAD_IMAGES = {
    'corrupt': (b'\x89PNG\r\n\x1a\n garbage', 'cannot decode 00000/img00000003.png'),
    'not an image': (b'hello', 'cannot decode 00000/img00000003.png'),
    'other size': (png_bytes(np.zeros([8, 8, 3], dtype=np.uint8)), '00000/img00000003.png in dataset'),
    'not square': (png_bytes(np.zeros([4, 8, 3], dtype=np.uint8)), 'is 8x4 with 3 channel(s)'),
    'gray among RGB': (png_bytes(np.zeros([4, 4, 1], dtype=np.uint8)), 'is 4x4 with 1 channel(s), unlike the first image'),
    '16-bit RGB': (png16_bytes(4, 3), '16-bit'),
    '16-bit gray': (png16_bytes(4, 1), '16-bit'),
}

@pytest.mark.parametrize('container', ['data.zip', 'data'])
@pytest.mark.parametrize('case', list(BAD_IMAGES))
def test_validate_names_the_bad_image(tmp_path, container, case):
    data, message = BAD_IMAGES[case]
    path = str(tmp_path / container)
    make_dataset(path, random_images(6), replace={'00000/img00000003.png': data})
    dataset = ImageFolderDataset(path=path)
    with pytest.raises(DatasetError, match=re.escape(message)) as info:
        dataset.validate()
    assert '\n' not in str(info.value) and '00000/img00000003.png' in str(info.value)
    # The same image, read in training, is an error naming it too.
    with pytest.raises(DatasetError, match='00000/img00000003.png'):
        dataset[3]
    dataset[2]  # The others are fine.

def test_validate_accepts_a_good_dataset_and_checks_only_the_subset_used(tmp_path):
    path = str(tmp_path / 'data.zip')
    make_dataset(path, random_images(6), replace={'00000/img00000005.png': b'garbage'})
    seed = next(s for s in range(100) if 5 not in ImageFolderDataset(path=path, max_size=5, random_seed=s)._raw_idx)
    ImageFolderDataset(path=path, max_size=5, random_seed=seed, xflip=True).validate()
    with pytest.raises(DatasetError, match='img00000005'):
        ImageFolderDataset(path=path).validate()

def test_16_bit_first_image_is_refused(tmp_path):
    path = str(tmp_path / 'data')
    make_dataset(path, random_images(2), replace={'00000/img00000000.png': png16_bytes(4, 1)})
    with pytest.raises(DatasetError, match='16-bit'):
        ImageFolderDataset(path=path)

def test_palette_images_are_color(tmp_path):
    """A palette PNG is a color image: it has 3 channels, and its pixels are the palette's colors."""
    path = str(tmp_path / 'data.zip')
    make_dataset(path, random_images(2), replace={'00000/img00000001.png': palette_png_bytes(4, (200, 30, 7))})
    dataset = ImageFolderDataset(path=path)
    dataset.validate()
    assert np.array_equal(dataset[1][0], np.broadcast_to(np.array([200, 30, 7], dtype=np.uint8)[:, None, None], [3, 4, 4]))

def test_bad_image_in_a_worker_is_one_line(tmp_path):
    path = str(tmp_path / 'data.zip')
    make_dataset(path, random_images(4), replace={'00000/img00000002.png': b'\x89PNG\r\n\x1a\n garbage'})
    dataset = ImageFolderDataset(path=path)
    with pytest.raises(DatasetError) as direct:
        dataset[2]
    assert str(direct.value).startswith(f'cannot decode 00000/img00000002.png in dataset {path}: ')
    with pytest.raises(DatasetError) as info:
        list(torch.utils.data.DataLoader(dataset, batch_size=1, num_workers=1))
    assert str(info.value) == str(direct.value)  # Not torch's "Caught DatasetError in DataLoader worker..." traceback.
