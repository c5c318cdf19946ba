"""torch_utils.persistence: exact round trips, and refusal of snapshots that would run code."""

import os
import pickle
import signal
import stat
import subprocess
import sys
import zipfile

import pytest
import torch

from torch_utils import bounded_read, persistence


@persistence.persistent_class
class TinyNet(torch.nn.Module):
    def __init__(self, width=4, use_bn=False, extra=None):
        super().__init__()
        self.fc1 = torch.nn.Linear(3, width)
        self.bn = torch.nn.BatchNorm1d(width) if use_bn else torch.nn.Identity()
        self.fc2 = torch.nn.Linear(width, 1)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def test_records_kwargs_and_requires_keywords():
    net = TinyNet(width=6, extra={'a': [1, 2]})
    assert net.init_kwargs == {'width': 6, 'extra': {'a': [1, 2]}}
    with pytest.raises(TypeError, match='keyword'):
        TinyNet(6)
    with pytest.raises(TypeError, match='plain data'):
        TinyNet(extra=torch.zeros(1))


def test_round_trip_restores_identical_outputs(tmp_path):
    torch.manual_seed(0)
    net = TinyNet(width=7, use_bn=True)
    net.train()
    net(torch.randn(16, 3))  # Move the BatchNorm running statistics away from their init.
    net.eval()
    path = str(tmp_path / 'snap.pkl')
    opt = torch.optim.Adam(net.parameters())
    net(torch.randn(4, 3)).sum().backward()
    opt.step()
    persistence.save_snapshot(path, {'G': net, 'progress': {'step': 5, 'kimg': 1.5}, 'opt': opt.state_dict()})
    data = persistence.load_snapshot(path)
    x = torch.randn(10, 3)
    assert type(data.G) is TinyNet and not data.G.training
    assert torch.equal(data.G(x), net(x))
    assert data.progress.step == 5 and data.progress.kimg == 1.5
    opt2 = torch.optim.Adam(data.G.parameters())
    opt2.load_state_dict(data.opt)  # Optimizer state survives as plain data.
    assert torch.equal(opt2.state_dict()['state'][0]['exp_avg'], opt.state_dict()['state'][0]['exp_avg'])
    assert [f for f in os.listdir(tmp_path) if f != 'snap.pkl'] == []  # No temporary files left.


def test_refuses_unregistered_module(tmp_path):
    with pytest.raises(TypeError, match='persistent_class'):
        persistence.save_snapshot(str(tmp_path / 'x.pkl'), {'G': torch.nn.Linear(2, 2)})


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, 'w'))  # Creates the marker file if it ever runs.


@pytest.mark.parametrize('protocol', [2, pickle.HIGHEST_PROTOCOL])
def test_crafted_pickle_is_refused_and_never_runs(tmp_path, protocol):
    marker = str(tmp_path / 'pwned')
    path = str(tmp_path / 'evil.pkl')
    with open(path, 'wb') as f:
        pickle.dump({'G': _Payload(marker)}, f, protocol=protocol)
    with pytest.raises(persistence.UnsafeSnapshotError, match='refused'):
        persistence.load_snapshot(path)
    assert not os.path.exists(marker)


def test_snapshot_naming_foreign_class_is_refused(tmp_path):
    """A well-formed snapshot whose network class is not one of the project's own is refused."""
    net = TinyNet(width=3)
    path = str(tmp_path / 'forged.pkl')
    persistence.save_snapshot(path, {'G': net})
    payload = torch.load(path, weights_only=True)
    payload['data']['G']['__persistent_module__'] = 'subprocess.Popen'
    torch.save(payload, path)
    with pytest.raises(persistence.UnsafeSnapshotError, match='subprocess.Popen'):
        persistence.load_snapshot(path)


def test_not_a_snapshot(tmp_path):
    path = str(tmp_path / 'plain.pt')
    torch.save({'weights': torch.zeros(2)}, path)
    with pytest.raises(persistence.UnsafeSnapshotError, match='not a GN-GAN snapshot'):
        persistence.load_snapshot(path)


@pytest.mark.parametrize('umask', [0o022, 0o077, 0o002])
def test_snapshot_permissions_follow_umask(tmp_path, umask):
    """A snapshot gets the permissions of any other new file, not mkstemp's 0600."""
    old = os.umask(umask)
    try:
        persistence.save_snapshot(str(tmp_path / 'snap.pkl'), {'G': TinyNet()})
        with open(tmp_path / 'other.txt', 'w'):
            pass
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / 'snap.pkl').st_mode) == 0o666 & ~umask
    assert stat.S_IMODE(os.stat(tmp_path / 'snap.pkl').st_mode) == stat.S_IMODE(os.stat(tmp_path / 'other.txt').st_mode)


def test_remove_stale_temporaries_after_kill(tmp_path):
    """A writer killed (SIGKILL) between writing and renaming leaves its temporary file; it is removed
    afterwards, while a live writer's temporary file and other files stay."""
    script = ('import os, signal, sys, torch\n'
              'sys.path.insert(0, os.getcwd())\n'
              'from torch_utils import persistence\n'
              'os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)\n'
              f'persistence.save_snapshot({str(tmp_path / "network-snapshot-000001.pkl")!r}, {{"x": torch.zeros(3)}})\n')
    proc = subprocess.run([sys.executable, '-c', script], cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == -signal.SIGKILL
    stale = [f for f in os.listdir(tmp_path) if f.startswith('.network-snapshot-000001.pkl.')]
    assert len(stale) == 1 and stale[0].endswith('.tmp')
    live = tmp_path / f'.network-snapshot-000002.pkl.{os.getpid()}.0123abcd.tmp'
    other = tmp_path / '.keep.tmp'
    live.touch()
    other.touch()
    assert persistence.remove_stale_temporaries(str(tmp_path)) == [str(tmp_path / stale[0])]
    assert sorted(os.listdir(tmp_path)) == sorted([live.name, other.name])
    assert persistence.remove_stale_temporaries(str(tmp_path / 'missing')) == []


def test_object_graph_size_is_bounded(tmp_path, monkeypatch):
    """The pickled object graph (data.pkl) is capped before it is unpickled: Python objects take several
    times the bytes of their opcodes."""
    path = str(tmp_path / 'snap.pkl')
    persistence.save_snapshot(path, {'progress': {'values': list(range(1000))}})
    with zipfile.ZipFile(path) as z:
        pickle_size = next(info.file_size for info in z.infolist() if info.filename.endswith('data.pkl'))
    monkeypatch.setattr(bounded_read, 'MAX_PICKLE_BYTES', pickle_size)
    assert persistence.load_snapshot(path).progress['values'] == list(range(1000))
    monkeypatch.setattr(bounded_read, 'MAX_PICKLE_BYTES', pickle_size - 1)
    with pytest.raises(persistence.UnsafeSnapshotError, match=f'data.pkl is {pickle_size:,} bytes'):
        persistence.load_snapshot(path)


def test_networks_are_probed_on_meta_before_being_built(tmp_path, monkeypatch):
    """A network is first built without storage; kwargs that disagree with the state dict are refused
    before the real constructor runs."""
    path = str(tmp_path / 'snap.pkl')
    persistence.save_snapshot(path, {'G': TinyNet(width=5)})
    payload = torch.load(path, weights_only=True)
    payload['data']['G']['init_kwargs']['width'] = 50_000_000  # 50M x 3 + 50M weights: 800 MB if allocated.
    torch.save(payload, path)
    built = []
    real_init = torch.nn.Linear.__init__

    def record(self, *args, **kwargs):
        built.append(torch.empty(0).device.type)  # The default device where the Linear is built.
        real_init(self, *args, **kwargs)
    monkeypatch.setattr(torch.nn.Linear, '__init__', record)
    with pytest.raises(persistence.UnsafeSnapshotError, match='more than'):
        persistence.load_snapshot(path)
    assert built and set(built) == {'meta'}


def test_kwargs_the_class_does_not_take_are_named():
    """A keyword the constructor does not take is refused by name, before anything is built from the kwargs."""
    from training.networks import sngan
    G = sngan.CNNGenerator(c_dim=0, img_resolution=16, img_channels=3, ch=4, z_dim=4)
    with pytest.raises(persistence.UnsafeSnapshotError) as info:
        persistence.rebuild_network(persistence.class_name_of(type(G)), dict(G.init_kwargs, channel_base=8), G.state_dict(),
                                    'snapshot.G')
    assert str(info.value) == 'snapshot.G.init_kwargs: CNNGenerator takes no argument "channel_base"'
