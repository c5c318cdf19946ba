"""Hostile files against every reader of outside files and every entry point: zip, npz and tar bombs, entries
claiming more bytes than the file holds, truncated archives, a detector that is not TorchScript, pickles and LMDB
databases made to take memory, a download larger than its cap.

Each is refused in one line that says why, and within torch_utils/bounded_read.py's bound: each entry point runs
its cases in a process of its own (on the CPU), whose peak memory is measured per case on Linux. The hostile
files are built in bench/hostile_cases.py without allocating what they claim.
"""

import bz2
import dataclasses
import gc
import gzip
import importlib.util
import io
import json
import lzma
import os
import tarfile
import warnings
import zipfile

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import dataset_tool
import legacy
from metrics import detectors, frechet_inception_distance
from bench import hostile_cases
from bench.hostile_cases import deflate_bomb, deflated, stored, zip_bytes
from torch_utils import bounded_read, persistence
from training.data.dataset import DatasetError, ImageFolderDataset

BOMB_BYTES = 512 << 20  # Each bomb expands to this: far above the bound for files of ~0.5 MB.

#----------------------------------------------------------------------------
# The reader itself.


def archive_of(raw: bytes, torch_format: bool = False) -> bounded_read.ZipArchive:
    return bounded_read.ZipArchive(io.BytesIO(raw), 'x.zip', torch_format=torch_format)


def refused(raw: bytes, torch_format: bool = False) -> str:
    with pytest.raises(bounded_read.RefusedFileError) as info:
        archive_of(raw, torch_format)
    assert '\n' not in str(info.value) and str(info.value).startswith('x.zip')
    return str(info.value)


def test_valid_archives_read():
    archive = archive_of(zip_bytes([stored('a.txt', b'abc'), deflated('b.txt', b'x' * 1000)]))
    assert archive.read('a.txt') == b'abc' and archive.read('b.txt') == b'x' * 1000
    assert len(archive_of(hostile_cases.snapshot_bytes(), torch_format=True).entries) > 4
    assert any('/code/' in name for name in archive_of(hostile_cases.detector_bytes(), torch_format=True).entries)


def test_bomb_entry_is_refused_before_it_is_decompressed(monkeypatch):
    raw = zip_bytes([stored('a.png', b'png'), deflate_bomb('b.png', BOMB_BYTES)])
    archive = archive_of(raw)
    monkeypatch.setattr(zipfile.ZipFile, 'open', lambda *args, **kwargs: pytest.fail('decompressed'))
    with pytest.raises(bounded_read.RefusedFileError, match=r'entry b.png expands to 536,870,912 bytes, more than the file'):
        archive.read('b.png')
    assert 'is compressed' in refused(raw, torch_format=True)


def test_entries_claiming_more_than_the_file_are_refused():
    abc = stored('a', b'abc')
    assert 'claims 1000000 bytes, more than the file holds' in refused(
        zip_bytes([dataclasses.replace(abc, file_size=1000000, compress_size=1000000)]))
    assert 'is stored as 3 bytes but claims 1000000' in refused(zip_bytes([dataclasses.replace(abc, file_size=1000000)]))
    assert 'claim more bytes than the file holds' in refused(hostile_cases.overlapping(100, 1 << 20), torch_format=True)


def test_truncated_and_damaged_archives_are_refused():
    assert 'not a zip archive' in refused(hostile_cases.truncated(hostile_cases.snapshot_bytes()))
    raw = zip_bytes([stored('a', b'abc')])
    end = raw.rindex(b'PK\x05\x06')  # Its directory size (4 bytes at 12) made 4 GiB - 1.
    assert 'does not fit in the' in refused(raw[:end + 12] + (2 ** 32 - 1).to_bytes(4, 'little') + raw[end + 16:])
    assert 'compression method 12' in refused(zip_bytes([dataclasses.replace(stored('a', b'abc'), method=12)]))


def write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def tar_refusal(path: str, read: bool = False) -> str:
    """The one-line refusal of listing (and with `read`, reading whole) every member of the tar archive at `path`."""
    with pytest.raises(bounded_read.RefusedFileError) as info:
        with bounded_read.TarArchive(path) as archive:
            for member in archive.members():
                if read:
                    archive.read(member)
    assert '\n' not in str(info.value) and str(info.value).startswith(path)
    return str(info.value)


@pytest.fixture
def decompressed(monkeypatch) -> list:
    """How many bytes gzip.GzipFile.read has returned, in one item."""
    total = [0]
    read = gzip.GzipFile.read

    def counting_read(self, *args, **kwargs):
        data = read(self, *args, **kwargs)
        total[0] += len(data)
        return data
    monkeypatch.setattr(gzip.GzipFile, 'read', counting_read)
    return total


def test_tar_members_are_read_whole_or_in_pieces(tmp_path):
    """Plain and compressed (gzip, bzip2, xz) archives written by tarfile, and one written by hand (pax headers)."""
    members = {'cifar-10-batches-py/x.bin': os.urandom(3000), 'b' * 150: b'hello'}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode='w', format=tarfile.PAX_FORMAT) as tar:  # A 150-character name: a pax record.
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raws = {'plain.tar': buffer.getvalue(), 'x.tar.gz': gzip.compress(buffer.getvalue()), 'x.tar.bz2': bz2.compress(buffer.getvalue()),
            'x.tar.xz': lzma.compress(buffer.getvalue()), 'by-hand.tar': hostile_cases.tar_bytes(list(members.items()))}
    for name, raw in raws.items():
        with bounded_read.TarArchive(write(tmp_path / name, raw)) as archive:
            listed = list(archive.members())
            assert [member.name for member in listed] == list(members), name
            assert archive.read(listed[1]) == b'hello'
            f = archive.open(listed[0])
            assert f.read(1000) + f.read(5000) == members['cifar-10-batches-py/x.bin']
    for name, raw in [('text', b'not a tar archive\n' * 100), ('text.gz', gzip.compress(b'not a tar archive\n' * 100))]:
        with pytest.raises(bounded_read.NotATarArchive, match=f'^{tmp_path / name}: not a tar archive'):
            bounded_read.TarArchive(write(tmp_path / name, raw))
    cut = write(tmp_path / 'cut.tar.gz', gzip.compress(hostile_cases.tar_bytes([('a', os.urandom(5000))]))[:3000])
    assert 'damaged tar archive (Compressed file ended before the end-of-stream marker was reached)' in tar_refusal(cut, read=True)


def test_tar_bomb_is_refused_before_it_is_decompressed(tmp_path, decompressed):
    path = write(tmp_path / 'bomb.tar.gz', hostile_cases.tar_gz_bomb('data_batch_1', BOMB_BYTES))
    assert f'member data_batch_1 claims 536,870,912 bytes, more than the archive can hold (4x the file\'s ' \
           f'{os.path.getsize(path):,} + 64 MiB)' in tar_refusal(path)
    assert decompressed[0] <= 1 << 20  # The first headers, not the zeros.
    claims = write(tmp_path / 'claims.tar', hostile_cases.tar_claiming('data_batch_1', 1 << 20))
    assert 'member data_batch_1 claims 1,048,576 bytes, more than the archive can hold (a tar archive holds no more than ' \
           'its file)' in tar_refusal(claims)


def test_tar_members_read_whole_are_bounded_one_by_one_and_together(tmp_path, monkeypatch):
    """With no allowance, what read() returns may add up to the file's size: a member beyond it is refused, and
    one that would take the members read before beyond it."""
    monkeypatch.setattr(bounded_read, 'ENTRY_ALLOWANCE', 0)
    noise = os.urandom(100_000)  # Incompressible: the file is about as large.
    path = write(tmp_path / 'x.tar.gz', gzip.compress(hostile_cases.tar_bytes([('noise', noise), ('small', bytes(60_000)),
                                                                              ('large', bytes(150_000))])))
    size = os.path.getsize(path)
    with bounded_read.TarArchive(path) as archive:
        noise_member, small, large = archive.members()
        with pytest.raises(bounded_read.RefusedFileError, match=f'member large is 150,000 bytes, more than the file\'s {size:,} '):
            archive.read(large)
        assert archive.read(noise_member) == noise
        with pytest.raises(bounded_read.RefusedFileError, match='member small is 60,000 bytes, which with the 100,000 read before '
                                                                f'is more than the file\'s {size:,} '):
            archive.read(small)
        assert archive.open(small).read(60_000) == bytes(60_000)  # In pieces: not bounded by the file's size.


def test_tar_member_count_and_headers_are_bounded(tmp_path, decompressed):
    many = write(tmp_path / 'many.tar.gz', hostile_cases.tar_gz_of_empty_members(bounded_read.MAX_TAR_MEMBERS + 1))
    assert f'it lists more than {bounded_read.MAX_TAR_MEMBERS:,} members' in tar_refusal(many)
    enough = write(tmp_path / 'enough.tar.gz', hostile_cases.tar_gz_of_empty_members(bounded_read.MAX_TAR_MEMBERS))
    with bounded_read.TarArchive(enough) as archive:
        assert len(list(archive.members())) == bounded_read.MAX_TAR_MEMBERS
    decompressed[0] = 0
    pax = write(tmp_path / 'pax.tar.gz', hostile_cases.tar_gz_pax_bomb(BOMB_BYTES))
    assert f'a member\'s headers take more than {bounded_read.MAX_TAR_HEADER_BYTES:,} bytes' in tar_refusal(pax)
    assert decompressed[0] <= 1 << 20


#----------------------------------------------------------------------------
# The loaders.


def test_snapshot_bomb_is_refused_and_the_official_hint_reads_nothing(tmp_path, monkeypatch):
    path = tmp_path / 'bomb.pkl'
    path.write_bytes(hostile_cases.snapshot_bomb(BOMB_BYTES))
    monkeypatch.setattr(torch, 'load', lambda *args, **kwargs: pytest.fail('torch.load read the refused file'))
    with pytest.raises(persistence.UnsafeSnapshotError, match='is compressed'):
        legacy.load_network(str(path))
    with pytest.raises(legacy.OfficialCheckpointError, match='is compressed'):
        legacy.load_official_checkpoint(str(path), 'cifar10-cnn')


def save_stats(path, compressed: bool = False, **arrays) -> str:
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    return str(path)


def test_ref_stats_shapes_are_read_before_the_data(tmp_path):
    mu, sigma = np.arange(16.0), np.eye(16) * 2
    for kwargs in (dict(), dict(compressed=True)):
        got = frechet_inception_distance.load_ref_stats(save_stats(tmp_path / 'ok.npz', mu=mu, sigma=sigma, **kwargs))
        np.testing.assert_array_equal(got[0], mu)
        np.testing.assert_array_equal(got[1], sigma)
    got = frechet_inception_distance.load_ref_stats(save_stats(tmp_path / 'other.npz', mu=mu.astype('>f4'),
                                                               sigma=np.asfortranarray(sigma + np.tri(16))))
    assert got[0].dtype == np.float64 and np.array_equal(got[1], sigma + np.tri(16))

    def refusal(name: str, data: bytes, num_features: int | None = None) -> str:
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError) as info:
            frechet_inception_distance.load_ref_stats(str(tmp_path / name), num_features)
        assert '\n' not in str(info.value)
        return str(info.value)

    assert 'sigma is [40000, 40000], but the statistics are 2048-dimensional' in refusal(
        'claims.npz', hostile_cases.stats_claiming(40000))
    assert 'sigma is [8192, 8192], but the statistics are 2048-dimensional' in refusal(
        'bomb.npz', hostile_cases.stats_bomb(2048, 8192))
    assert 'mu is [2048], but the statistics are 1000-dimensional' in refusal(
        'dim.npz', hostile_cases.stats_bomb(2048, 64), num_features=1000)
    mu_entry = stored('mu.npy', hostile_cases.npy_header((40000,)) + bytes(8 * 40000))
    sigma_entry = stored('sigma.npy', hostile_cases.npy_header((40000, 40000)))
    assert 'more than 4096 features are not read' in refusal('big.npz', zip_bytes([mu_entry, sigma_entry]))
    assert 'is float16, not float32 or float64' in refusal('f16.npz', open(save_stats(
        tmp_path / 'f16.npz', mu=np.zeros(4, np.float16), sigma=np.eye(4)), 'rb').read())
    assert 'holds Python objects' in refusal('obj.npz', zip_bytes([stored('mu.npy', hostile_cases.npy_header((4,), '|O')),
                                                                   sigma_entry]))
    assert 'is not an .npz file' in refusal('cut.npz', hostile_cases.truncated(open(save_stats(
        tmp_path / 'whole.npz', mu=np.zeros(1000), sigma=np.eye(1000)), 'rb').read()))
    short = hostile_cases.deflated('sigma.npy', hostile_cases.npy_header((4, 4)) + bytes(64))
    assert 'declares 192 bytes' in refusal('short.npz', zip_bytes([stored('mu.npy', hostile_cases.npy_header((4,)) + bytes(32)),
                                                                   dataclasses.replace(short, file_size=192)]))


def test_detector_must_be_torchscript_within_the_bound(tmp_path):
    (tmp_path / 'weights.pt').write_bytes(hostile_cases.snapshot_bytes())
    with pytest.raises(detectors.DetectorUnavailableError, match='is not TorchScript'):
        detectors.get_feature_detector(str(tmp_path / 'weights.pt'))
    bomb = zip_bytes([deflate_bomb(e.name, BOMB_BYTES) if e.name.endswith('/data/0') else e
                      for e in hostile_cases.entries_of(hostile_cases.detector_bytes())])
    (tmp_path / 'bomb.pt').write_bytes(bomb)
    with pytest.raises(detectors.DetectorUnavailableError, match='is compressed'):
        detectors.get_feature_detector(str(tmp_path / 'bomb.pt'))
    (tmp_path / 'detector.pt').write_bytes(hostile_cases.detector_bytes())
    assert detectors.get_feature_detector(str(tmp_path / 'detector.pt')) is not None


def test_dataset_json_larger_than_labels_can_be_is_refused(tmp_path):
    images = [stored('a.png', hostile_cases.png_bytes(0)), stored('b.png', hostile_cases.png_bytes(9))]
    labels = json.dumps(dict(labels=[['a.png', 0], ['b.png', 1]]), indent=4).encode()
    (tmp_path / 'ok.zip').write_bytes(zip_bytes(images + [deflated('dataset.json', labels)]))
    assert ImageFolderDataset(str(tmp_path / 'ok.zip'), use_labels=True).label_dim == 2
    for name, text in [('long.zip', b'{"labels": null}' + b' ' * 5000), ('deep.zip', b'[' * 4000 + b']' * 4000),
                       ('lists.zip', b'{"labels": [' + b'[], ' * 1000 + b'[]]}')]:
        (tmp_path / name).write_bytes(zip_bytes(images + [deflated('dataset.json', text)]))
        gc.collect()  # Files left open by earlier tests in this process warn now, not below.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always', ResourceWarning)
            with pytest.raises(DatasetError) as info:
                ImageFolderDataset(str(tmp_path / name), use_labels=True)
            assert '\n' not in str(info.value) and 'dataset.json' in str(info.value)
            result = CliRunner().invoke(dataset_tool.main, [f'--source={tmp_path / name}', f'--dest={tmp_path / "out" / name}'])
            assert result.exit_code == 1 and 'dataset.json' in result.output.strip().splitlines()[-1], result.output
            del info, result  # The refusals' tracebacks hold the readers: the file must be closed already.
            gc.collect()
        assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
    (tmp_path / 'bomb.zip').write_bytes(hostile_cases.image_entry_bomb(BOMB_BYTES))
    with pytest.raises(DatasetError, match='entry img0.png expands to'):
        ImageFolderDataset(str(tmp_path / 'bomb.zip'))

#----------------------------------------------------------------------------
# Every entry point, its cases in a process of its own.

ENTRY_POINTS = ('generate.py', 'calc_metrics.py', 'train.py', 'legacy.py', 'dataset_tool.py')


@pytest.fixture(scope='module')
def oversized_download():
    """A server on 127.0.0.1 whose /detector.pt sends BOMB_BYTES of zeros, with no Content-Length: only counting
    the bytes as they arrive finds it over the cap."""
    with hostile_cases.LoopbackServer({'/detector.pt': hostile_cases.send(BOMB_BYTES, length=None)}) as server:
        yield server


@pytest.mark.parametrize('script', ENTRY_POINTS)
def test_every_entry_point_refuses_in_one_line_within_the_bound(script, tmp_path, oversized_download):
    """generate.py, calc_metrics.py (--network, --ref-stats, --images, --detector, a download), train.py (--resume,
    --ref-stats, --data), legacy.py and dataset_tool.py (zip, tar and LMDB sources), each on every hostile file it
    reads: the last line of stderr is `Error: ` with the case's reason, there is no traceback, and the peak memory
    (Linux) is within bounded_read's bound above the script's footprint. Nothing is left in the download cache."""
    cases = hostile_cases.hostile_cases(str(tmp_path), BOMB_BYTES, scripts=(script,), url=oversized_download.url(''))
    footprint, outcomes = hostile_cases.run_entry_point(script, cases, cwd=str(tmp_path))
    failures = []
    for case, outcome in zip(cases, outcomes):
        where = f'{case.entry} on {case.file}'
        if outcome.returncode != 1 or 'Traceback' in outcome.stderr or not outcome.last_line.startswith('Error: ') or \
                case.reason not in outcome.last_line:
            failures.append(f'{where}: exit {outcome.returncode}, expected "{case.reason}", stderr ends {outcome.stderr[-300:]!r}')
        bound = None if footprint is None else \
            footprint + bounded_read.MEMORY_FACTOR * case.file_size + bounded_read.MEMORY_ALLOWANCE
        if bound is not None and outcome.peak_rss > bound:
            failures.append(f'{where}: peak memory {outcome.peak_rss >> 20} MiB, bound {bound >> 20} MiB '
                            f'({footprint >> 20} MiB the script\'s own)')
    downloads = tmp_path / 'cache' / 'downloads'
    assert not failures and (not downloads.exists() or os.listdir(downloads) == []), '\n'.join(failures)
    assert not (tmp_path / 'ran').exists()  # The NVIDIA pickles' payloads.
    num_variants = len(hostile_cases.nvidia_variants())  # The NVIDIA pickle variants, through each reader of networks.
    assert len(cases) == {'generate.py': 8 + num_variants, 'calc_metrics.py': 14 + num_variants, 'train.py': 12 + num_variants,
                          'legacy.py': 3, 'dataset_tool.py': 10 if importlib.util.find_spec('lmdb') else 8}[script]
