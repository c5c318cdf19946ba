"""Build a training dataset: a zip archive (or folder) of PNGs plus dataset.json.

The output is exactly what training/data/dataset.py reads:

    00000/img00000000.png, 00000/img00000001.png, ..., 00001/img00001000.png, ...
    dataset.json   {"labels": [["00000/img00000000.png", 6], ...]}   or   {"labels": null}

Images keep their channel count: grayscale sources give 1-channel (mode L) PNGs,
color sources 3-channel RGB. Every output image must be square and of one size,
which --resolution and --transform arrange for sources that are not.

The archive is written under a temporary name next to the destination and
renamed at the end, so an error or an interrupt never leaves a half-written
dataset behind.

The main process reads the source and writes the dataset; worker processes (--workers) decode,
crop, resize and encode. At most IMAGES_IN_FLIGHT_PER_WORKER images per worker are read ahead of
the writer, and results are written in source order, so the dataset is the same, byte for byte, as
a one-process run's, and so is the first error met.
"""

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import collections
import concurrent.futures
import contextlib
import dataclasses
import io
import json
import math
import multiprocessing
import os
import pickle
import posixpath
import re
import shutil
import signal
import sys
import tarfile
import tempfile
import time
import zipfile
import zlib
from typing import BinaryIO, Callable, Iterator, Optional, Union

import click
import numpy as np
import PIL
import PIL.Image
from tqdm import tqdm

import dnnlib
from torch_utils import bounded_read
from torch_utils.threads import set_threads
from training.data.dataset import DatasetError, image_channels, max_labels_size

CIFAR10_SIZE = 32     # CIFAR-10 images are 32x32 RGB, stored as rows of 3*32*32 bytes (channel, row, column).
STL10_SIZE = 96       # STL-10 images are 96x96 RGB, stored per channel in column-major order.
STL10_CLASSES = 10    # STL-10 label files hold 1..10.

# Zip entries get a fixed timestamp so that rebuilding a dataset gives a byte-identical archive.
ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)

#----------------------------------------------------------------------------
# What every source yields.

@dataclasses.dataclass
class SourceImage:
    name: str                       # Where the image came from, for error messages.
    data: Union[bytes, np.ndarray]  # The encoded file (decoded by convert(), in a worker), or pixels: uint8 [height, width, channels 1 or 3].
    label: Optional[int]            # Class index, or None for an unlabeled source.

@dataclasses.dataclass
class Source:
    num_images: int                 # How many images `images` yields (after --max-images).
    images: Iterator[SourceImage]   # Read lazily, one at a time.

def limit(count: int, max_images: Optional[int]) -> int:
    return count if max_images is None else min(count, max_images)

#----------------------------------------------------------------------------
# Decoding.

def image_to_array(image: PIL.Image.Image, name: str) -> np.ndarray:
    """Pixels as uint8 [H, W, C]: grayscale modes become L (C = 1), everything else RGB (C = 3).

    Modes with more than 8 bits per sample would lose precision silently, so they are refused, by
    the rule the training loader applies (training.data.dataset.image_channels).
    """
    try:
        mode = 'L' if image_channels(image, name) == 1 else 'RGB'
    except DatasetError as err:
        raise click.ClickException(str(err)) from err
    pixels = np.asarray(image.convert(mode))
    return pixels[:, :, np.newaxis] if mode == 'L' else pixels

def decode_image(data: bytes, name: str) -> np.ndarray:
    try:
        with PIL.Image.open(io.BytesIO(data)) as image:
            return image_to_array(image, name)  # Checks the mode before convert() decodes the pixels.
    except PIL.UnidentifiedImageError as err:  # Its own message shows a BytesIO repr instead of the file.
        raise click.ClickException(f'cannot read image {name}: not an image, or a format Pillow cannot read') from err
    except (OSError, SyntaxError, ValueError, EOFError, zlib.error, PIL.Image.DecompressionBombError) as err:
        raise click.ClickException(f'cannot read image {name}: {err}') from err

def parse_labels(data: bytes, name: str) -> Optional[dict[str, int]]:
    """The labels of dataset.json as {file name: class index}, or None where it says {"labels": null}."""
    expected = 'expected {"labels": [["file name", class index], ...]} or {"labels": null}'
    try:
        labels = json.loads(data)['labels']
    except (ValueError, KeyError, TypeError, RecursionError) as err:  # RecursionError: nested too deeply.
        raise click.ClickException(f'{name}: {expected}') from err
    if labels is None:
        return None
    if not isinstance(labels, list):
        raise click.ClickException(f'{name}: {expected}')
    for entry in labels:
        ok = isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
        if not ok or not isinstance(entry[1], int) or isinstance(entry[1], bool) or entry[1] < 0:
            raise click.ClickException(f'{name}: bad entry {json.dumps(entry)}; {expected}')
    return dict(labels)

#----------------------------------------------------------------------------
# Image folders and zip archives of images (CelebA-HQ is an image folder too).

def image_extensions() -> set[str]:
    PIL.Image.init()
    return set(PIL.Image.EXTENSION)

def open_image_collection(fnames: list[str], read: Callable[[str], bytes], size: Callable[[str], int], describe: Callable[[str], str],
                          max_images: Optional[int]) -> Source:
    """Images of a folder or zip, given their relative names (sorted, '/'-separated), a reader and the size of each file.

    A dataset.json at the top level supplies labels; it must then label every image used. It is read
    only when no larger than labels of the images can be (training.data.dataset.max_labels_size).
    """
    extensions = image_extensions()
    image_fnames = sorted(fname for fname in fnames if posixpath.splitext(fname)[1].lower() in extensions)
    if not image_fnames:
        raise click.ClickException(f'no images found in {describe("")}')
    labels = None
    if 'dataset.json' in fnames:
        if size('dataset.json') > max_labels_size(image_fnames):
            raise click.ClickException(f'{describe("dataset.json")} is {size("dataset.json"):,} bytes; labels of its '
                                       f'{len(image_fnames)} images take at most {max_labels_size(image_fnames):,}')
        labels = parse_labels(read('dataset.json'), describe('dataset.json'))
    image_fnames = image_fnames[:limit(len(image_fnames), max_images)]
    if labels is not None:
        unlabeled = [fname for fname in image_fnames if fname not in labels]
        if unlabeled:
            raise click.ClickException(f'{describe("dataset.json")} has no label for {unlabeled[0]} ({len(unlabeled)} images unlabeled)')

    def iterate() -> Iterator[SourceImage]:
        for fname in image_fnames:
            yield SourceImage(name=describe(fname), data=read(fname), label=None if labels is None else labels[fname])
    return Source(num_images=len(image_fnames), images=iterate())

def open_image_folder(root: str, max_images: Optional[int]) -> Source:
    fnames = []
    for dirpath, _dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        fnames += [fname if rel == '.' else posixpath.join(*rel.split(os.sep), fname) for fname in filenames]

    def read(fname: str) -> bytes:
        try:
            with open(os.path.join(root, *fname.split('/')), 'rb') as f:
                return f.read()
        except OSError as err:
            raise click.ClickException(f'cannot read {os.path.join(root, fname)}: {err.strerror}') from err
    return open_image_collection(fnames, read, lambda fname: os.path.getsize(os.path.join(root, *fname.split('/'))),
                                 lambda fname: os.path.join(root, fname), max_images)

def open_image_zip(path: str, max_images: Optional[int]) -> Source:
    """Images of a zip archive, read within torch_utils/bounded_read.py's bound: an entry is decompressed only
    when it expands to at most the archive's size + ENTRY_ALLOWANCE."""
    try:
        archive = bounded_read.ZipArchive(path)
    except bounded_read.RefusedFileError as err:
        raise click.ClickException(str(err)) from err
    except OSError as err:
        raise click.ClickException(f'cannot open zip archive {path}: {err}') from err

    def read(fname: str) -> bytes:
        try:
            return archive.read(fname)
        except bounded_read.RefusedFileError as err:
            raise click.ClickException(str(err)) from err
        except OSError as err:
            raise click.ClickException(f'cannot read {fname} in {path}: {err}') from err
    fnames = [info.filename for info in archive.entries.values() if not info.is_dir()]
    try:
        return open_image_collection(fnames, read, lambda fname: archive.entries[fname].file_size,
                                     lambda fname: f'{path}:{fname}' if fname else path, max_images)
    except BaseException:  # Refused (its dataset.json, say): nothing more will be read.
        archive.close()
        raise

#----------------------------------------------------------------------------
# CIFAR-10 (cifar-10-python.tar.gz).

class NumpyOnlyUnpickler(pickle.Unpickler):
    """The CIFAR-10 batches are pickles, and unpickling can run arbitrary code.

    A batch is a dict of bytes, lists and numpy arrays, so only the few globals that rebuild an array are
    allowed; anything else is refused before it runs. Those build only what a batch holds: an array is made
    empty (shape (0,), as ndarray.__reduce__ writes it) and then set from bytes of exactly its size, never from
    a list of Python objects (numpy sets an object array's state unchecked: a short list crashes the process).
    Load a pickle only after bounded_read.check_pickle.
    """
    numpy_core = 'numpy._core' if np.lib.NumpyVersion(np.__version__) >= '2.0.0' else 'numpy.core'

    class Array(np.ndarray):
        """The ndarray of a batch: its state (version, shape, dtype, Fortran order, data) is checked before numpy sets it."""

        def __setstate__(self, state: tuple) -> None:
            _version, shape, dtype, _fortran, data = state if isinstance(state, tuple) and len(state) == 5 else (None,) * 5
            if not isinstance(dtype, np.dtype) or not isinstance(data, bytes) or not isinstance(shape, tuple) or \
                    len(data) != math.prod(shape) * dtype.itemsize:
                raise pickle.UnpicklingError('refusing an array that is not plain data of its declared size')
            super().__setstate__(state)

    @staticmethod
    def reconstruct(subtype: type, shape: tuple, dtype: object) -> np.ndarray:
        """numpy's _reconstruct for an empty Array (what ndarray.__reduce__ writes), nothing else."""
        if subtype is not NumpyOnlyUnpickler.Array or shape != (0,):
            raise pickle.UnpicklingError('refusing to reconstruct anything but an empty array')
        return np.ndarray.__new__(subtype, shape, np.uint8)

    @staticmethod
    def encode(text: str, encoding: str) -> bytes:
        """_codecs.encode as Python 3 pickles bytes at protocol 2: Latin-1, one byte per character."""
        if not isinstance(text, str) or encoding not in ('latin1', 'latin-1'):
            raise pickle.UnpicklingError('refusing _codecs.encode but of text to Latin-1')
        return text.encode('latin-1')

    def find_class(self, module: str, name: str):
        canonical = (re.sub(r'^numpy\._core\b', 'numpy.core', module), name)
        if canonical == ('numpy', 'ndarray'):
            return NumpyOnlyUnpickler.Array
        if canonical == ('numpy.core.multiarray', '_reconstruct'):
            return NumpyOnlyUnpickler.reconstruct
        if canonical == ('_codecs', 'encode'):  # Python 3 pickles of bytes at protocol 2.
            return NumpyOnlyUnpickler.encode
        if canonical in (('numpy', 'dtype'), ('numpy.core.numeric', '_frombuffer')):  # Bounded by the bytes they get.
            return super().find_class(re.sub(r'^numpy\.core\b', self.numpy_core, canonical[0]), name)
        raise pickle.UnpicklingError(f'refusing to load {module}.{name}')

def open_cifar10(archive: bounded_read.TarArchive, path: str, subset: str, max_images: Optional[int]) -> Source:
    """The images of CIFAR-10's python archive: its batches read whole, within the archive's bound
    (bounded_read.TarArchive.read: 5 batches of 31 MB in a 170 MB file), their pickles checked before they are loaded."""
    batch_names = [f'data_batch_{i}' for i in range(1, 6)] if subset == 'train' else ['test_batch']
    images, labels = [], []
    for batch_name in batch_names:
        member = find_member(archive, batch_name)
        if member is None:
            raise click.ClickException(f'{path} is not a CIFAR-10 python archive: {batch_name} is missing')
        try:
            data = archive.read(member)
            bounded_read.check_pickle(data, f'{path}: {member.name}')
        except bounded_read.RefusedFileError as err:
            raise click.ClickException(str(err)) from err
        try:
            batch = NumpyOnlyUnpickler(io.BytesIO(data), encoding='bytes').load()
            pixels = np.asarray(batch[b'data'], dtype=np.uint8)
            batch_labels = np.asarray(batch[b'labels'], dtype=np.int64)
        except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError, OverflowError, MemoryError, RecursionError) as err:
            raise click.ClickException(f'cannot read {member.name} in {path}: {dnnlib.util.first_line(err, 200)}') from err
        del data, batch
        if pixels.ndim != 2 or pixels.shape[1] != 3 * CIFAR10_SIZE**2 or batch_labels.shape != (pixels.shape[0],):
            raise click.ClickException(f'{member.name} in {path} is not a CIFAR-10 batch: data has shape {list(pixels.shape)} and {batch_labels.size} labels')
        images.append(pixels.reshape(-1, 3, CIFAR10_SIZE, CIFAR10_SIZE).transpose(0, 2, 3, 1))
        labels.append(batch_labels)
    images, labels = np.concatenate(images), np.concatenate(labels)
    num_images = limit(len(images), max_images)

    def iterate() -> Iterator[SourceImage]:
        for idx in range(num_images):
            yield SourceImage(name=f'{path} ({subset} image {idx})', data=images[idx], label=int(labels[idx]))
    return Source(num_images=num_images, images=iterate())

#----------------------------------------------------------------------------
# STL-10 (stl10_binary.tar.gz or its extracted folder).

STL10_FILE = re.compile(r'(train|test|unlabeled)_[Xy]\.bin')

def open_stl10(open_file: Callable[[str], tuple[int, BinaryIO]], path: str, subset: str, max_images: Optional[int]) -> Source:
    """Images of one STL-10 split; open_file(basename) -> (size in bytes, binary file) or raises ClickException.

    Each image is 3 * 96 * 96 bytes: channel by channel, each channel column by column, so
    byte c*96*96 + x*96 + y holds channel c of the pixel at row y, column x.
    """
    image_bytes = 3 * STL10_SIZE**2
    size, images_file = open_file(f'{subset}_X.bin')
    if size % image_bytes != 0:
        raise click.ClickException(f'{subset}_X.bin in {path} is not an STL-10 image file: {size} bytes is not a multiple of {image_bytes}')
    num_images = limit(size // image_bytes, max_images)
    labels = None
    if subset != 'unlabeled':
        labels_size, labels_file = open_file(f'{subset}_y.bin')
        if labels_size != size // image_bytes:  # One byte per image: checked before anything is read.
            raise click.ClickException(f'{subset}_y.bin in {path} is not an STL-10 label file for {size // image_bytes} images')
        labels = np.frombuffer(read_exactly(labels_file, labels_size, f'{subset}_y.bin in {path}'), dtype=np.uint8).astype(np.int64) - 1
        if labels.min(initial=0) < 0 or labels.max(initial=0) >= STL10_CLASSES:
            raise click.ClickException(f'{subset}_y.bin in {path} is not an STL-10 label file for {size // image_bytes} images')

    def iterate() -> Iterator[SourceImage]:
        for idx in range(num_images):
            name = f'{path} ({subset} image {idx})'
            data = np.frombuffer(read_exactly(images_file, image_bytes, name), dtype=np.uint8)
            yield SourceImage(name=name, data=data.reshape(3, STL10_SIZE, STL10_SIZE).transpose(2, 1, 0), label=None if labels is None else int(labels[idx]))
    return Source(num_images=num_images, images=iterate())

def read_exactly(f: BinaryIO, num_bytes: int, name: str) -> bytes:
    try:
        data = f.read(num_bytes)
    except bounded_read.RefusedFileError as err:  # An archive's member: names the archive.
        raise click.ClickException(str(err)) from err
    except OSError as err:
        raise click.ClickException(f'cannot read {name}: {err}') from err
    if len(data) != num_bytes:
        raise click.ClickException(f'cannot read {name}: file ends early')
    return data

def stl10_folder_opener(root: str) -> Optional[Callable[[str], tuple[int, BinaryIO]]]:
    """An open_file for open_stl10 if root (or root/stl10_binary) holds STL-10 files, else None."""
    for folder in (root, os.path.join(root, 'stl10_binary')):
        if os.path.isdir(folder) and any(STL10_FILE.fullmatch(fname) for fname in os.listdir(folder)):
            def open_file(basename: str, folder: str = folder) -> tuple[int, BinaryIO]:
                file_path = os.path.join(folder, basename)
                try:
                    return os.path.getsize(file_path), open(file_path, 'rb')
                except OSError as err:
                    raise click.ClickException(f'cannot read {file_path}: {err.strerror}') from err
            return open_file
    return None

#----------------------------------------------------------------------------
# Tar archives: CIFAR-10 or STL-10.

def find_member(archive: bounded_read.TarArchive, basename: str) -> Optional[tarfile.TarInfo]:
    """The first regular file called basename, reading the archive only as far as needed."""
    try:
        for member in archive.members():
            if member.isfile() and posixpath.basename(member.name) == basename:
                return member
    except bounded_read.RefusedFileError as err:
        raise click.ClickException(str(err)) from err
    return None

def open_tar(archive: bounded_read.TarArchive, subset: Optional[str], max_images: Optional[int]) -> Source:
    """CIFAR-10's or STL-10's archive, read within bounded_read.TarArchive's bound; the kind is told by the first
    member whose name tells it, later members are read only when needed. The archive is closed once read (CIFAR-10:
    its batches are read at once; STL-10: its images are streamed) or refused."""
    path = archive.name
    kind = None
    try:
        try:
            for member in archive.members():
                basename = posixpath.basename(member.name)
                if basename in ('batches.meta', 'data_batch_1', 'test_batch'):
                    kind = 'cifar10'
                elif STL10_FILE.fullmatch(basename):
                    kind = 'stl10'
                if kind is not None:
                    break
        except bounded_read.RefusedFileError as err:
            raise click.ClickException(str(err)) from err
        if kind is None:
            raise click.ClickException(f'unknown source format: {path} is a tar archive but neither CIFAR-10 (python version) nor STL-10 (binary version)')
        subset = check_subset(subset, kind)
        if kind == 'cifar10':
            with archive:
                return open_cifar10(archive, path, subset, max_images)

        def open_file(basename: str) -> tuple[int, BinaryIO]:
            member = find_member(archive, basename)
            if member is None:
                raise click.ClickException(f'{path} has no {basename}')
            return member.size, archive.open(member)
        source = open_stl10(open_file, path, subset, max_images)
    except BaseException:
        archive.close()
        raise

    def stream() -> Iterator[SourceImage]:
        with archive:
            yield from source.images
    return Source(num_images=source.num_images, images=stream())

#----------------------------------------------------------------------------
# LSUN (an lmdb folder of encoded images, e.g. church_outdoor_train_lmdb).

def open_lmdb(path: str, max_images: Optional[int]) -> Source:
    """An LSUN database, read from its data.mdb within bounded_read.LmdbDatabase's bound, one entry at a time."""
    try:
        database = bounded_read.LmdbDatabase(path)
    except bounded_read.RefusedFileError as err:
        raise click.ClickException(str(err)) from err
    except OSError as err:
        raise click.ClickException(f'cannot read {os.path.join(path, "data.mdb")}: {err.strerror}') from err
    num_images = limit(database.num_entries, max_images)

    def iterate() -> Iterator[SourceImage]:
        with database:
            try:
                for key, value in database.entries(num_images):
                    yield SourceImage(name=f'{path} (key {key.decode(errors="replace")})', data=value, label=None)
            except bounded_read.RefusedFileError as err:
                raise click.ClickException(str(err)) from err
    return Source(num_images=num_images, images=iterate())

#----------------------------------------------------------------------------
# Choosing the reader.

def check_subset(subset: Optional[str], kind: Optional[str]) -> Optional[str]:
    """--subset for a source kind: CIFAR-10 train (default) or test; STL-10 unlabeled (default), train or test."""
    if kind == 'cifar10':
        if subset == 'unlabeled':
            raise click.ClickException('CIFAR-10 has no unlabeled subset; use --subset=train or --subset=test')
        return subset or 'train'
    if kind == 'stl10':
        return subset or 'unlabeled'
    if subset is not None:
        raise click.ClickException('--subset applies only to CIFAR-10 and STL-10 sources')
    return None

def open_source(source: str, subset: Optional[str], max_images: Optional[int]) -> Source:
    if not os.path.exists(source):
        raise click.ClickException(f'source {source} does not exist')
    if os.path.isdir(source):
        if os.path.isfile(os.path.join(source, 'data.mdb')):
            check_subset(subset, None)
            return open_lmdb(source, max_images)
        stl10_open_file = stl10_folder_opener(source)
        if stl10_open_file is not None:
            return open_stl10(stl10_open_file, source, check_subset(subset, 'stl10'), max_images)
        check_subset(subset, None)
        return open_image_folder(source, max_images)
    if zipfile.is_zipfile(source):
        check_subset(subset, None)
        return open_image_zip(source, max_images)
    try:
        archive = bounded_read.TarArchive(source)
    except bounded_read.NotATarArchive:
        raise click.ClickException(f'unknown source format: {source} is not a folder, a zip archive, a CIFAR-10 or STL-10 tar archive, or an LSUN lmdb folder') from None
    except bounded_read.RefusedFileError as err:
        raise click.ClickException(str(err)) from err
    except OSError as err:
        raise click.ClickException(f'cannot read {source}: {err.strerror}') from err
    return open_tar(archive, subset, max_images)

#----------------------------------------------------------------------------
# Resizing and cropping.

def resize(pixels: np.ndarray, width: int, height: int,
           resample: PIL.Image.Resampling = PIL.Image.Resampling.LANCZOS) -> np.ndarray:
    """Lanczos resampling (or `resample`); PIL widens the kernel when shrinking, so downscaling is antialiased."""
    if pixels.shape[:2] == (height, width):
        return pixels
    image = PIL.Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels)
    resized = np.asarray(image.resize((width, height), resample))
    return resized.reshape(height, width, pixels.shape[2])

@dataclasses.dataclass(frozen=True)
class Transform:
    """The map from source pixels [H, W, C] to output pixels (plain data, so that worker processes get it too).

    - no --transform: resize to --resolution when given, else leave the image as it is; a source of another
      aspect ratio than --resolution's is refused, as resizing would distort it (a transform says how to fit it);
    - center-crop: the largest centered square, resized to --resolution (which must be square);
    - center-crop-wide: the largest centered region of aspect W:H, resized to WxH and placed in
      the middle of a black WxW square (for wide scenes such as LSUN cars);
    - squash: the whole image resized to WxH, its aspect ratio not kept, bilinear: the GN-GAN authors'
      LSUN Church preprocessing (torchvision's Resize((256, 256)) on the PIL image, i.e. PIL's bilinear).
    """
    kind: Optional[str]                         # None, 'center-crop', 'center-crop-wide' or 'squash'.
    resolution: Optional[tuple[int, int]]       # (W, H), or None: keep the size.

    def __call__(self, pixels: np.ndarray, name: str) -> np.ndarray:
        """The output pixels of the source image `name`; a one-line ClickException where it cannot be transformed."""
        if self.resolution is None:
            return pixels
        width, height = self.resolution
        if self.kind is None:
            src_height, src_width = pixels.shape[:2]
            if src_width * height != src_height * width:  # Aspect ratios differ: w / h != W / H.
                raise click.ClickException(f'{name} is {src_width}x{src_height}, of another aspect than '
                                           f'--resolution={width}x{height}: resizing would distort it; '
                                           'add --transform=center-crop, center-crop-wide or squash')
            return resize(pixels, width, height)
        if self.kind == 'squash':
            return resize(pixels, width, height, PIL.Image.Resampling.BILINEAR)
        if self.kind == 'center-crop':
            crop = min(pixels.shape[:2])
            top, left = (pixels.shape[0] - crop) // 2, (pixels.shape[1] - crop) // 2
            return resize(pixels[top : top + crop, left : left + crop], width, height)
        src_height, src_width = pixels.shape[:2]
        crop_height, crop_width = src_height, src_width
        if src_height * width > src_width * height:
            crop_height = round(src_width * height / width)
        else:
            crop_width = round(src_height * width / height)
        top, left = (src_height - crop_height) // 2, (src_width - crop_width) // 2
        cropped = resize(pixels[top : top + crop_height, left : left + crop_width], width, height)
        canvas = np.zeros([width, width, pixels.shape[2]], dtype=np.uint8)
        canvas[(width - height) // 2 : (width - height) // 2 + height] = cropped
        return canvas

def make_transform(transform: Optional[str], resolution: Optional[tuple[int, int]]) -> Transform:
    """--transform and --resolution as a Transform, or a one-line refusal of a combination that cannot work."""
    if transform is not None and resolution is None:
        raise click.ClickException(f'--transform={transform} needs --resolution')
    if transform == 'center-crop' and resolution[0] != resolution[1]:
        raise click.ClickException(f'--transform=center-crop needs a square --resolution, not {resolution[0]}x{resolution[1]}')
    if transform == 'center-crop-wide' and resolution[1] > resolution[0]:
        raise click.ClickException(f'--transform=center-crop-wide needs a --resolution at least as wide as tall, not {resolution[0]}x{resolution[1]}')
    return Transform(transform, resolution)

def parse_resolution(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> Optional[tuple[int, int]]:
    """'WxH' -> (W, H); a single number N means NxN."""
    if value is None:
        return None
    match = re.fullmatch(r'(\d+)(?:x(\d+))?', value)
    if match is None or int(match.group(1)) == 0 or (match.group(2) is not None and int(match.group(2)) == 0):
        raise click.BadParameter(f'expected WxH such as 256x256, not {value!r}')
    width = int(match.group(1))
    return width, int(match.group(2) or width)

#----------------------------------------------------------------------------
# Writing.

def check_dest(dest: str) -> None:
    if not os.path.lexists(dest):
        return
    if os.path.isdir(dest) and not is_zip_dest(dest) and not os.listdir(dest):
        return
    raise click.ClickException(f'destination {dest} already exists{" and is not empty" if os.path.isdir(dest) else ""}; give a new path or remove it first')

def is_zip_dest(dest: str) -> bool:
    return dest.lower().endswith('.zip')

def current_umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask

@contextlib.contextmanager
def open_dest(dest: str) -> Iterator[Callable[[str, bytes], None]]:
    """A function write(name, data) that adds a file to the dataset; the dataset appears at dest only on success.

    Everything goes to a temporary file or folder in dest's directory, renamed to dest
    at the end (atomic on one file system) and removed if anything fails.
    """
    parent = os.path.dirname(os.path.abspath(dest))
    prefix = f'.{os.path.basename(os.path.abspath(dest))}.'
    made = missing_dirs(parent)  # Made here, so removed again if the dataset is not written.
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkstemp(dir=parent, prefix=prefix, suffix='.tmp')[1] if is_zip_dest(dest) else tempfile.mkdtemp(dir=parent, prefix=prefix, suffix='.tmp')
    except OSError as err:
        remove_dirs(made)
        raise click.ClickException(f'cannot write {dest}: {err}') from err
    try:
        if is_zip_dest(dest):
            with zipfile.ZipFile(tmp, 'w', compression=zipfile.ZIP_STORED) as archive:
                def write(name: str, data: bytes) -> None:
                    info = zipfile.ZipInfo(name, date_time=ZIP_DATE_TIME)
                    info.external_attr = 0o644 << 16  # Unix permissions rw-r--r-- for unzip.
                    archive.writestr(info, data)
                yield guard_write(write, dest)
            os.chmod(tmp, 0o666 & ~current_umask())
            os.replace(tmp, dest)
        else:
            def write(name: str, data: bytes) -> None:
                path = os.path.join(tmp, *name.split('/'))
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, 'wb') as f:
                    f.write(data)
            yield guard_write(write, dest)
            os.chmod(tmp, 0o777 & ~current_umask())
            if os.path.isdir(dest):
                os.rmdir(dest)
            os.rename(tmp, dest)
    except OSError as err:
        remove(tmp)
        remove_dirs(made)
        raise click.ClickException(f'cannot write {dest}: {err}') from err
    except BaseException:
        remove(tmp)
        remove_dirs(made)
        raise

def missing_dirs(path: str) -> list[str]:
    """path and those of its ancestors that do not exist yet, deepest first."""
    missing = []
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        missing.append(path)
        path = os.path.dirname(path)
    return missing

def remove_dirs(dirs: list[str]) -> None:
    """Remove the (empty) directories `dirs`, deepest first."""
    for path in dirs:
        with contextlib.suppress(OSError):
            os.rmdir(path)

def guard_write(write: Callable[[str, bytes], None], dest: str) -> Callable[[str, bytes], None]:
    """write, with OS errors (disk full, permissions) reported as a one-line error about dest."""
    def guarded(name: str, data: bytes) -> None:
        try:
            write(name, data)
        except OSError as err:
            raise click.ClickException(f'cannot write {dest}: {err}') from err
    return guarded

def remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)

def dataset_bytes(dest: str) -> int:
    """The size of a written dataset: the zip archive's, or the sum of the folder's files."""
    if is_zip_dest(dest):
        return os.path.getsize(dest)
    return sum(os.path.getsize(os.path.join(dirpath, fname))
               for dirpath, _dirnames, fnames in os.walk(dest) for fname in fnames)

def encode_png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    PIL.Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels).save(buffer, format='png')
    return buffer.getvalue()

#----------------------------------------------------------------------------
# Conversion: decoding, cropping, resizing and encoding, in worker processes, written in source order.

IMAGES_IN_FLIGHT_PER_WORKER = 2  # Read ahead of the writer: keeps every worker busy, bounds memory whatever the dataset's size.

def convert(item: SourceImage, transform: Transform) -> tuple[bytes, tuple[int, ...]]:
    """(PNG, shape [H, W, C]) of the output image of one source image; a one-line ClickException when it cannot be read."""
    pixels = transform(decode_image(item.data, item.name) if isinstance(item.data, bytes) else item.data, item.name)
    return encode_png(pixels), pixels.shape

Converted = Iterator[tuple[str, Optional[int], bytes, tuple[int, ...]]]  # (source name, label, PNG, shape), in source order.

def default_workers() -> int:
    """One per core this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1

def start_worker() -> None:
    """A worker leaves Ctrl-C to the main process, which stops the workers and removes what was written."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

@contextlib.contextmanager
def conversion(transform: Transform, workers: int) -> Iterator[Callable[[Iterator[SourceImage]], Converted]]:
    """A function that converts source images in order: in this process for one worker, else in a pool of
    `workers` processes that is shut down (its workers ended) however the conversion ends."""
    if workers == 1:
        yield lambda images: ((item.name, item.label, *convert(item, transform)) for item in images)
        return
    fork = 'fork' in multiprocessing.get_all_start_methods() and sys.platform != 'darwin'  # macOS: fork is unsafe.
    executor = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context('fork' if fork else 'spawn'),
                                                      initializer=start_worker)
    try:
        executor.submit(int).result()  # Forks every worker now, before the progress bar starts a thread.
        yield lambda images: in_source_order(executor, images, transform, workers * IMAGES_IN_FLIGHT_PER_WORKER)
    except concurrent.futures.process.BrokenProcessPool as err:
        raise click.ClickException('a worker process ended unexpectedly (out of memory?); try fewer --workers') from err
    finally:
        executor.shutdown(wait=True, cancel_futures=True)

def in_source_order(executor: concurrent.futures.Executor, images: Iterator[SourceImage], transform: Transform, max_in_flight: int) -> Converted:
    """The images converted by `executor`, at most `max_in_flight` at a time, yielded in source order. An error
    reading the source is raised in its turn, after the images before it, as in one process."""
    pending = collections.deque()  # (name, label, future), oldest first.
    source: Optional[Iterator[SourceImage]] = iter(images)
    while True:
        while source is not None and len(pending) < max_in_flight:
            try:
                item = next(source)
            except StopIteration:
                source = None
                break
            except Exception as err:  # noqa: BLE001 (raised again below, in its turn)
                failed = concurrent.futures.Future()
                failed.set_exception(err)
                pending.append((None, None, failed))
                source = None
                break
            pending.append((item.name, item.label, executor.submit(convert, item, transform)))
        if not pending:
            return
        name, label, future = pending.popleft()
        yield name, label, *future.result()

#----------------------------------------------------------------------------

@click.command()
@click.option('--source',       help='Images: folder, zip, CIFAR-10 or STL-10 archive, LSUN lmdb folder', metavar='PATH', type=str, required=True, callback=dnnlib.util.expand_user)
@click.option('--dest',         help='Output: a .zip archive, or else a folder', metavar='PATH',                      type=str, required=True, callback=dnnlib.util.expand_user)
@click.option('--max-images',   help='Use at most this many images (the first ones)', metavar='INT',                  type=click.IntRange(min=1))
@click.option('--resolution',   help='Output size, e.g. 256x256 (resizes images that differ; another aspect needs --transform)', metavar='WxH', type=str, callback=parse_resolution)
@click.option('--transform',    help='Crop before resizing to --resolution, or squash (the GN-GAN authors\' LSUN resize)', type=click.Choice(['center-crop', 'center-crop-wide', 'squash']))
@click.option('--subset',       help='CIFAR-10: train or test; STL-10: unlabeled, train or test  [default: train; unlabeled]', type=click.Choice(['train', 'test', 'unlabeled']))
@click.option('--drop-labels',  help='Write the images without their labels (dataset.json: null)',                    is_flag=True)
@click.option('--workers',      help='Processes that decode, resize and encode  [default: one per core]', metavar='INT', type=click.IntRange(min=1))
@click.option('--threads',      help='CPU threads of torch  [default: one per core]', metavar='INT',                  type=click.IntRange(min=1))
def main(source: str, dest: str, max_images: Optional[int], resolution: Optional[tuple[int, int]], transform: Optional[str], subset: Optional[str],
         drop_labels: bool, workers: Optional[int], threads: Optional[int]) -> None:
    """Convert an image dataset into the zip format that training reads.

    \b
    Examples:
    python dataset_tool.py --source=cifar-10-python.tar.gz --dest=cifar10.zip
    python dataset_tool.py --source=cifar-10-python.tar.gz --subset=test --dest=cifar10-test.zip
    python dataset_tool.py --source=stl10_binary.tar.gz --dest=stl10-48.zip --resolution=48x48
    python dataset_tool.py --source=celeba-hq-1024/ --dest=celebahq-256.zip --resolution=256x256
    python dataset_tool.py --source=church_outdoor_train_lmdb/ --dest=church256.zip \\
        --resolution=256x256 --transform=squash
    python dataset_tool.py --source=data/digits32.zip --dest=digits32-unlabeled.zip --drop-labels

    \b
    Output: PNGs named 00000/img00000000.png, ... and a dataset.json of
    {"labels": [[file name, class index], ...]} (or null for unlabeled
    sources and with --drop-labels). An image folder or zip keeps the labels of
    its own dataset.json.
    Grayscale sources stay 1-channel. All images must come out square and of
    one size; --resolution (with --transform for non-square sources) sees to it.
    Without labels, class-conditional presets refuse the data and 'quickstart'
    trains unconditionally.

    \b
    Images are converted by --workers processes and written in source order:
    the dataset is byte-identical whatever the number of workers.
    """
    start = time.monotonic()
    set_threads(threads)
    transform_pixels = make_transform(transform, resolution)
    check_dest(dest)
    src = open_source(source, subset, max_images)
    if src.num_images == 0:
        raise click.ClickException(f'no images in {source}')
    workers = min(workers or default_workers(), src.num_images)
    with open_dest(dest) as write, conversion(transform_pixels, workers) as convert_all, \
            tqdm(total=src.num_images, unit='img', disable=None) as progress:
        labels = []
        first = None  # (name, shape) of the first output image; all others must match it.
        for idx, (item_name, label, png, shape) in enumerate(convert_all(src.images)):
            height, width, channels = shape
            if first is None:
                first = (item_name, shape)
                if width != height:
                    hint = '--resolution=NxN with --transform=center-crop' if resolution is None else \
                        '--transform=center-crop-wide, or a square --resolution with --transform=center-crop'
                    raise click.ClickException(f'{item_name} is {width}x{height} but images must be square; use {hint}')
            elif channels != first[1][2]:
                raise click.ClickException(f'{item_name} has {channels} channel(s) but {first[0]} has {first[1][2]}; make all images grayscale or all RGB')
            elif shape != first[1]:
                raise click.ClickException(f'{item_name} is {width}x{height} but {first[0]} is {first[1][1]}x{first[1][0]}; use --resolution to make them one size')
            name = f'{idx // 1000:05d}/img{idx:08d}.png'
            write(name, png)
            labels.append([name, label])
            progress.update()
        has_labels = len(labels) > 0 and labels[0][1] is not None and not drop_labels
        write('dataset.json', json.dumps({'labels': labels if has_labels else None}).encode())
    height, width, channels = first[1]
    classes = f'labels of {max(label for _name, label in labels) + 1} classes' if has_labels else 'no labels'
    click.echo(f'Wrote {len(labels):,} image{"s" if len(labels) > 1 else ""} of {width}x{height} '
               f'{"RGB" if channels == 3 else "grayscale"}, {classes}, to {dest} ({dataset_bytes(dest):,} bytes) '
               f'in {dnnlib.util.format_time(time.monotonic() - start)}')

#----------------------------------------------------------------------------

if __name__ == '__main__':
    main()
