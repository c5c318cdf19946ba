"""Training data: a zip archive or folder of images with optional class labels.

The format is what dataset_tool.py writes: PNGs (any names, any sub-folders)
plus a top-level dataset.json, {"labels": [["00000/img00000000.png", 6], ...]}
or {"labels": null}. Images are read lazily, one per __getitem__, so a dataset
of any size opens instantly and each DataLoader worker reads only its share.
"""

import io
import json
import os
import posixpath
import zipfile
import zlib
from typing import BinaryIO, Optional

import numpy as np
import PIL.Image
import PIL.ImageMode
import torch

from torch_utils import bounded_read

# The largest dataset.json read: this, plus per image its JSON-quoted name and this many bytes (a label
# entry `["name", 1234], ` takes 10 bytes more than the name with four-digit classes; room for indentation).
_LABELS_ALLOWANCE = 4096
_LABEL_BYTES = 64


def max_labels_size(image_fnames: list[str]) -> int:
    """The most bytes a dataset.json labelling these images is read with. Parsing JSON takes up to ~24 bytes
    of Python objects per byte of text (an empty list per '[],'), so a larger file is refused unread and
    the parse stays proportional to the images, whatever the file holds."""
    return _LABELS_ALLOWANCE + sum(len(json.dumps(fname)) + _LABEL_BYTES for fname in image_fnames)

class DatasetError(ValueError):
    """A dataset that cannot be used as asked; the message says why in one line, for the user.

    Raised in a DataLoader worker, it comes back to the main process as a DatasetError whose message
    torch has made the worker's whole traceback; the constructor keeps only the original line.
    """

    def __init__(self, message: str) -> None:
        if '\nOriginal Traceback' in message:
            last = message.rstrip().splitlines()[-1]
            message = last.partition('DatasetError: ')[2] or last
        super().__init__(message)


def image_channels(image: PIL.Image.Image, name: str) -> int:
    """Channels of the uint8 array an image becomes: 1 for grayscale modes, 3 for all others (alpha
    dropped, palettes expanded). Reads the header only (PIL opens images lazily).

    More than 8 bits per sample would be clipped or truncated silently, so 16-bit (PNG keeps 16-bit
    RGB as mode RGB; its raw mode says ;16) and float images are refused, by the tool and the loader alike.
    """
    raw_modes = [str(tile.args) for tile in image.tile]
    if image.mode in ('I', 'F') or image.mode.startswith('I;16') or any(';16' in raw for raw in raw_modes):
        raise DatasetError(f'{name}: 16-bit or float images ({image.mode}, raw {"/".join(raw_modes) or "-"}) '
                           f'are not supported; convert them to 8 bits')
    return 1 if PIL.ImageMode.getmode(image.mode).basemode == 'L' else 3

#----------------------------------------------------------------------------

class Dataset(torch.utils.data.Dataset):
    """Indexing, labels, subsets and x-flips over raw images that a subclass loads.

    Item i is raw image raw_idx[i], mirrored when xflip[i]: with xflip=True the
    items are the raw images followed by their mirror images (len doubles).
    Labels are class indices in the data and one-hot vectors of label_dim =
    (largest class index + 1) entries in the items.
    """

    def __init__(self,
        name: str,                      # Dataset name, for logs and run directory names.
        raw_shape: list[int],           # Shape of the raw image data: [num_images, channels, height, width].
        use_labels: bool = False,       # Return one-hot class labels? Else labels have shape [0].
        max_size: Optional[int] = None, # Use a random subset of at most this many raw images; None = all.
        xflip: bool = False,            # Append a horizontally mirrored copy of every image (doubles len)?
        random_seed: int = 0,           # Seed that picks the max_size subset.
    ):
        if max_size is not None and max_size < 1:
            raise DatasetError(f'max_size must be at least 1, not {max_size}')
        self._name = name
        self._raw_shape = list(raw_shape)
        self._use_labels = use_labels
        self._max_size = max_size
        self._xflip_enabled = xflip
        self._random_seed = random_seed

        raw_idx = np.arange(self._raw_shape[0], dtype=np.int64)
        if max_size is not None and max_size < len(raw_idx):
            raw_idx = np.sort(np.random.RandomState(random_seed).choice(raw_idx, size=max_size, replace=False))
        self._xflip = np.concatenate([np.zeros_like(raw_idx, dtype=bool)] + ([np.ones_like(raw_idx, dtype=bool)] if xflip else []))
        self._raw_idx = np.tile(raw_idx, 2 if xflip else 1)

        self._raw_labels = self._load_raw_labels() if use_labels else None
        if self._raw_labels is not None and self._raw_labels.shape != (self._raw_shape[0],):
            raise DatasetError(f'{name}: {len(self._raw_labels)} labels for {self._raw_shape[0]} images')
        self._label_dim = 0 if self._raw_labels is None or len(self._raw_labels) == 0 else int(self._raw_labels.max()) + 1

    def _load_raw_image(self, raw_idx: int) -> np.ndarray:
        """uint8 [channels, height, width]."""
        raise NotImplementedError

    def _load_raw_labels(self) -> Optional[np.ndarray]:
        """int64 [num_images] class indices, or None for an unlabeled dataset."""
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._raw_idx)

    def __getitem__(self, idx: int) -> tuple[np.ndarray, np.ndarray]:
        """(uint8 image [C, H, W], float32 one-hot label [label_dim], or [0] without labels)."""
        image = self._load_raw_image(int(self._raw_idx[idx]))
        if self._xflip[idx]:
            image = image[:, :, ::-1]
        return np.ascontiguousarray(image), self.get_label(idx)

    def get_label(self, idx: int) -> np.ndarray:
        label = np.zeros(self.label_shape, dtype=np.float32)
        if self._label_dim > 0:
            label[self._raw_labels[self._raw_idx[idx]]] = 1
        return label

    @property
    def name(self) -> str:
        return self._name

    @property
    def image_shape(self) -> list[int]:
        return self._raw_shape[1:]

    @property
    def num_channels(self) -> int:
        return self.image_shape[0]

    @property
    def resolution(self) -> int:
        return self.image_shape[1]

    @property
    def label_shape(self) -> list[int]:
        return [self._label_dim]

    @property
    def label_dim(self) -> int:
        return self._label_dim

    @property
    def has_labels(self) -> bool:
        return self._label_dim > 0

#----------------------------------------------------------------------------

class ImageFolderDataset(Dataset):
    """Images of a zip archive or a folder (searched recursively), labels from its dataset.json.

    Images must be square and all of one size, all grayscale or all color, with 8
    bits per sample (checked for the first image when the dataset opens, for every
    image's header by validate(), and for each image when it is read). The zip archive is
    opened lazily by each process that reads it and never pickled: a handle
    inherited through fork would share its file offset with the parent's, and
    concurrent DataLoader workers would then read each other's bytes.
    """

    def __init__(self,
        path: str,                      # Zip archive or folder of images, with an optional dataset.json.
        resolution: Optional[int] = None, # Expected image resolution; None = whatever the data has.
        use_labels: bool = False,       # Return one-hot class labels? Else labels have shape [0].
        max_size: Optional[int] = None, # Use a random subset of at most this many images; None = all.
        xflip: bool = False,            # Append a horizontally mirrored copy of every image (doubles len)?
        random_seed: int = 0,           # Seed that picks the max_size subset.
    ):
        self._path = path
        self._zipfile = None
        self._zipfile_pid = None
        try:
            if os.path.isdir(path):
                self._kind = 'dir'
                all_fnames = []
                for dirpath, _dirnames, filenames in os.walk(path):
                    rel = os.path.relpath(dirpath, path)
                    all_fnames += [fname if rel == '.' else posixpath.join(*rel.split(os.sep), fname) for fname in filenames]
            elif os.path.isfile(path) and zipfile.is_zipfile(path):
                self._kind = 'zip'
                all_fnames = [info.filename for info in self._get_zipfile().entries.values() if not info.is_dir()]
            elif os.path.exists(path):
                raise DatasetError(f'dataset {path} is neither a zip archive nor a folder')
            else:
                raise DatasetError(f'dataset {path} does not exist')
            self._all_fnames = set(all_fnames)

            PIL.Image.init()
            self._image_fnames = sorted(fname for fname in all_fnames if posixpath.splitext(fname)[1].lower() in PIL.Image.EXTENSION)
            if not self._image_fnames:
                raise DatasetError(f'dataset {path} holds no images')
            first_image = self._decode(self._image_fnames[0])
            channels, height, width = first_image.shape
            if height != width:
                raise DatasetError(f'dataset {path}: images must be square, but {self._image_fnames[0]} is {width}x{height}')
            if resolution is not None and height != resolution:
                raise DatasetError(f'dataset {path} has resolution {width}x{height}, not the expected {resolution}x{resolution}')
            name = os.path.splitext(os.path.basename(os.path.normpath(path)))[0]
            super().__init__(name=name, raw_shape=[len(self._image_fnames), channels, height, width],
                use_labels=use_labels, max_size=max_size, xflip=xflip, random_seed=random_seed)
        finally:
            self.close()  # Also when the data is refused; each process opens its own handle when it reads.

    def _get_zipfile(self) -> bounded_read.ZipArchive:
        """The zip archive, its directory checked by bounded_read (entries within the file, each read only
        when it expands to at most the archive's size + ENTRY_ALLOWANCE)."""
        if self._zipfile is None or self._zipfile_pid != os.getpid():
            try:
                self._zipfile = bounded_read.ZipArchive(self._path)
            except bounded_read.RefusedFileError as err:  # Names the archive.
                raise DatasetError(f'dataset {err}') from err
            except OSError as err:
                raise DatasetError(f'cannot open dataset {self._path}: {err}') from err
            self._zipfile_pid = os.getpid()
        return self._zipfile

    def _read(self, fname: str) -> bytes:
        try:
            if self._kind == 'dir':
                with open(os.path.join(self._path, *fname.split('/')), 'rb') as f:
                    return f.read()
            return self._get_zipfile().read(fname)
        except bounded_read.RefusedFileError as err:  # Names the archive and the entry.
            raise DatasetError(f'dataset {err}') from err
        except (OSError, zipfile.BadZipFile, EOFError) as err:
            raise DatasetError(f'cannot read {fname} in dataset {self._path}: {err}') from err

    def close(self) -> None:
        if self._zipfile is not None and self._zipfile_pid == os.getpid():
            self._zipfile.close()
        self._zipfile = None
        self._zipfile_pid = None

    def __getstate__(self) -> dict:
        return dict(self.__dict__, _zipfile=None, _zipfile_pid=None)

    def __del__(self):
        try:
            self.close()
        except Exception:  # The interpreter may be shutting down; nothing left to release.
            pass

    def _describe(self, fname: str) -> str:
        return f'{fname} in dataset {self._path}'

    def _decode(self, fname: str) -> np.ndarray:
        """uint8 [C, H, W] with C = 1 for grayscale images and 3 for all others."""
        try:
            with PIL.Image.open(io.BytesIO(self._read(fname))) as image:
                mode = 'L' if image_channels(image, self._describe(fname)) == 1 else 'RGB'
                pixels = np.array(image.convert(mode))  # A writable copy (torch warns about read-only arrays).
        except DatasetError:
            raise
        except PIL.UnidentifiedImageError as err:  # Its own message names a BytesIO, not the file.
            raise DatasetError(f'cannot decode {self._describe(fname)}: not an image Pillow can read') from err
        except (OSError, SyntaxError, ValueError, EOFError, zlib.error, PIL.Image.DecompressionBombError) as err:
            raise DatasetError(f'cannot decode {self._describe(fname)}: {err}') from err
        return pixels[np.newaxis] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)

    def validate(self) -> None:
        """Check every image this dataset uses against the first one, from headers only: readable, same
        size, same channel count, 8 bits per sample. Raises DatasetError naming the first bad file.

        Call it once before training: it opens each image without decoding its pixels, so a bad file
        is reported up front rather than hours into a run. Damage inside the pixel data shows only
        when an image is decoded; __getitem__ then raises DatasetError naming the file.
        """
        expected = self.image_shape
        try:
            for raw_idx in np.unique(self._raw_idx):
                fname = self._image_fnames[raw_idx]
                try:
                    with self._open(fname) as f, PIL.Image.open(f) as image:
                        width, height = image.size
                        channels = image_channels(image, self._describe(fname))
                except DatasetError:
                    raise
                except PIL.UnidentifiedImageError as err:
                    raise DatasetError(f'cannot decode {self._describe(fname)}: not an image Pillow can read') from err
                except (OSError, SyntaxError, ValueError, EOFError, zlib.error, zipfile.BadZipFile, PIL.Image.DecompressionBombError) as err:
                    raise DatasetError(f'cannot decode {self._describe(fname)}: {err}') from err
                if [channels, height, width] != expected:
                    raise DatasetError(f'{self._describe(fname)} is {width}x{height} with {channels} channel(s), unlike '
                                       f'the first image, {self._image_fnames[0]}: {expected[2]}x{expected[1]} with {expected[0]}')
        finally:
            self.close()

    def _open(self, fname: str) -> BinaryIO:
        """A file object for one image, from which PIL reads only as far as it needs."""
        if self._kind == 'dir':
            return open(os.path.join(self._path, *fname.split('/')), 'rb')
        return self._get_zipfile().open(fname)

    def _load_raw_image(self, raw_idx: int) -> np.ndarray:
        fname = self._image_fnames[raw_idx]
        pixels = self._decode(fname)
        if list(pixels.shape) != self.image_shape:
            raise DatasetError(f'{self._describe(fname)} has shape {list(pixels.shape)} [C, H, W], unlike the first image: {self.image_shape}')
        return pixels

    def _load_raw_labels(self) -> Optional[np.ndarray]:
        if 'dataset.json' not in self._all_fnames:
            return None
        expected = 'expected {"labels": [["file name", class index], ...]} or {"labels": null}'
        max_size = max_labels_size(self._image_fnames)
        size = (os.path.getsize(os.path.join(self._path, 'dataset.json')) if self._kind == 'dir'
                else self._get_zipfile().entries['dataset.json'].file_size)
        if size > max_size:
            raise DatasetError(f'dataset.json in {self._path} is {size:,} bytes; labels of its {len(self._image_fnames)} '
                               f'images take at most {max_size:,}')
        try:
            labels = json.loads(self._read('dataset.json'))['labels']
            if labels is None:
                return None
            labels = dict(labels)
        except (ValueError, KeyError, TypeError, RecursionError) as err:  # RecursionError: nested too deeply.
            raise DatasetError(f'dataset.json in {self._path}: {expected}') from err
        missing = [fname for fname in self._image_fnames if fname not in labels]
        if missing:
            raise DatasetError(f'dataset.json in {self._path} has no label for {missing[0]} ({len(missing)} images unlabeled)')
        values = [labels[fname] for fname in self._image_fnames]
        if not all(isinstance(value, int) and not isinstance(value, bool) and value >= 0 for value in values):
            raise DatasetError(f'dataset.json in {self._path}: labels must be class indices (integers >= 0)')
        return np.array(values, dtype=np.int64)

    @property
    def init_kwargs(self) -> dict:
        """Plain-data kwargs that rebuild this dataset via dnnlib.util.construct_class_by_name.

        The training loop stores them in snapshots as training_set_kwargs; resolution is
        that of the data, so a rebuilt dataset is checked against what was trained on.
        """
        return dict(class_name=f'{type(self).__module__}.{type(self).__qualname__}', path=self._path, resolution=self.resolution,
            use_labels=self._use_labels, max_size=self._max_size, xflip=self._xflip_enabled, random_seed=self._random_seed)
