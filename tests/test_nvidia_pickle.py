"""Tests of torch_utils/nvidia_pickle.py: StyleGAN2 pickles of NVIDIA's code become our networks, nothing of the file run.

Without a checkout, NVIDIA-style pickles are made here (bench/hostile_cases.py: what their persistence.py writes, from
our StyleGAN2 networks, which have their class names, kwargs and state), with an embedded source that writes a file
if it is ever run. With GNGAN_NVIDIA_CODE naming a checkout of NVlabs/stylegan2-ada-pytorch or NVlabs/stylegan3,
their own code builds networks with random weights, pickles them as their training loop does and computes their
images and logits, in a subprocess (their packages have our packages' names); ours must equal them.
"""

import collections
import io
import json
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import PIL.Image
import pytest
import torch
from click.testing import CliRunner

import calc_metrics
import dnnlib
import generate
import legacy
from bench import hostile_cases
from tests.support.stand_ins import make_detector, write_dataset_zip
from tests.support.runs import only_run_dir, run_cli, snapshots
from torch_utils import nvidia_pickle, persistence
from training.networks import stylegan2

NVIDIA_CODE = os.environ.get('GNGAN_NVIDIA_CODE')


def load(data: bytes, name: str = 'nvidia.pkl') -> tuple:
    dropped = []
    networks = nvidia_pickle.load_network_pickle(io.BytesIO(data), name, dropped=dropped.append)
    return networks, dropped


def outputs(networks: dict, seed: int = 0) -> dict:
    """G's images (const noise, truncation 0.7) and D's logits, computed in float64 from the same inputs."""
    G, D = networks['G'], networks['D']
    gen = torch.Generator().manual_seed(seed)
    z, c = torch.randn([4, G.z_dim], generator=gen), torch.eye(4)[:, :G.c_dim]
    img = torch.randn([4, 3, G.img_resolution, G.img_resolution], generator=gen)
    with torch.no_grad():
        return {'G': G(z, c, truncation_psi=0.7, noise_mode='const'), 'D': D(img, c)}

#----------------------------------------------------------------------------
# NVIDIA-style pickles made here.


@pytest.mark.parametrize('protocol', [3, 4, 5])  # Python 3.7's default (NVIDIA's release), 3.8's, the newest.
@pytest.mark.parametrize('c_dim', [0, 4])
def test_nvidia_style_pickle_gives_the_same_networks_and_runs_nothing(c_dim, protocol, tmp_path):
    flag = tmp_path / 'ran'
    networks = hostile_cases.nvidia_networks(c_dim=c_dim, resolution=16)
    data = hostile_cases.nvidia_pickle(dict(networks, augment_pipe=networks['D'], training_set_kwargs=dict(
        class_name='training.dataset.ImageFolderDataset', path='ffhq.zip', use_labels=c_dim > 0, max_size=7, xflip=True,
        resolution=16)), hostile_cases.nvidia_source(str(flag)), protocol=protocol)
    loaded, dropped = load(data)
    assert not flag.exists()
    assert sorted(loaded) == ['D', 'G', 'G_ema', 'training_set_kwargs']
    for name in ('G', 'D', 'G_ema'):
        assert type(loaded[name]) is type(networks[name]) and loaded[name].init_kwargs == networks[name].init_kwargs
        assert not loaded[name].training and not any(p.requires_grad for p in loaded[name].parameters())
        theirs = networks[name].state_dict()
        assert list(loaded[name].state_dict()) == list(theirs)
        for key, value in loaded[name].state_dict().items():
            assert torch.equal(value, theirs[key]), key
    expected, got = outputs(networks), outputs(loaded)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0)
    # NVIDIA's ImageFolderDataset kwargs name ours; augment_pipe is dropped in one line.
    assert loaded.training_set_kwargs == dict(class_name='training.dataset.ImageFolderDataset', path='ffhq.zip',
                                              use_labels=c_dim > 0, max_size=7, xflip=True, resolution=16)
    assert dropped == ['nvidia.pkl: dropped augment_pipe (training.networks.Discriminator): this project does not use it']


def test_stylegan3_repository_kwargs_and_defaults():
    """Their StyleGAN3 copy: synthesis kwargs flat in Generator(**synthesis_kwargs), other defaults (num_fp16_res 4,
    conv_clamp 256, w_avg_beta 0.998), fused_modconv_default; read as StyleGAN2-ADA's kwargs with those made explicit."""
    networks = hostile_cases.nvidia_networks(resolution=16)
    G, D = networks['G'], networks['D']
    object.__setattr__(G, 'init_kwargs', dict(z_dim=8, c_dim=0, w_dim=8, img_resolution=16, img_channels=3,
                                              mapping_kwargs={'num_layers': 2}, channel_base=128, channel_max=16,
                                              fused_modconv_default='inference_only'))
    object.__setattr__(D, 'init_kwargs', dict(c_dim=0, img_resolution=16, img_channels=3, channel_base=128,
                                              channel_max=16, epilogue_kwargs={'mbstd_group_size': 2}))
    source = hostile_cases.nvidia_source(generator_args='mapping_kwargs={}, **synthesis_kwargs')
    loaded, _ = load(hostile_cases.nvidia_pickle({'G': G, 'D': D}, source))
    assert loaded.G.init_kwargs == dict(z_dim=8, c_dim=0, w_dim=8, img_resolution=16, img_channels=3,
                                        mapping_kwargs={'num_layers': 2, 'w_avg_beta': 0.998},
                                        synthesis_kwargs={'channel_base': 128, 'channel_max': 16, 'num_fp16_res': 4,
                                                          'conv_clamp': 256, 'fused_modconv_default': 'inference_only'})
    assert loaded.D.init_kwargs == dict(D.init_kwargs, num_fp16_res=4, conv_clamp=256)
    assert loaded.G.synthesis.b16.use_fp16 and loaded.G.synthesis.b16.conv1.conv_clamp == 256


def refused(data: bytes, *reason: str) -> str:
    with pytest.raises(nvidia_pickle.NvidiaPickleError) as e:
        load(data)
    message = str(e.value)
    assert len(message.splitlines()) == 1 and message.startswith('nvidia.pkl: refused to load: ')
    assert message.endswith('; nothing in it was run')
    for text in reason:
        assert text in message
    return message


def test_globals_outside_the_stand_ins_are_refused_unrun(tmp_path):
    flag = tmp_path / 'ran'
    refused(hostile_cases.nvidia_pickle_calling_os_system(str(flag)), 'names the global posix.system, which is not read')
    assert not flag.exists()
    refused(hostile_cases.nvidia_pickle({'G': hostile_cases.PickledCall(print, 'x')}, ''), 'names the global builtins.print')


@pytest.mark.parametrize('case', ['unrecognised source', 'alias-free StyleGAN3', 'augment pipe as G', 'foreign layer',
                                  'not a layer'])
def test_classes_outside_the_allow_list_are_refused_unrun(case, tmp_path):
    flag = tmp_path / 'ran'
    networks = hostile_cases.nvidia_networks()
    source, names, reason = hostile_cases.nvidia_source(str(flag)), None, None
    if case == 'unrecognised source':
        source = f'import pathlib; pathlib.Path({str(flag)!r}).write_text("ran")\nclass Generator: pass\n'
        reason = 'G is a Generator of an unrecognised module source, which is not read (only training.networks.Generator'
    elif case == 'alias-free StyleGAN3':
        source = hostile_cases.nvidia_source(str(flag), classes=('SynthesisInput', 'SynthesisLayer', 'SynthesisNetwork'))
        reason = 'G is a training.networks_stylegan3.Generator, which is not read'
    elif case == 'augment pipe as G':
        source = hostile_cases.nvidia_source(str(flag), classes=('AugmentPipe',))
        names, reason = {'Generator': 'AugmentPipe'}, 'G is a training.augment.AugmentPipe, which is not read'
    elif case == 'foreign layer':
        names, reason = {'SynthesisLayer': 'Payload'}, 'G.synthesis.b4.conv1 is a Payload, which training.networks does not define'
    else:
        networks['G'].synthesis.b4._modules['conv1'] = {'weight': torch.zeros(2)}
        reason = 'G.synthesis.b4.conv1 is a dict, not a layer of training.networks'
    refused(hostile_cases.nvidia_pickle(networks, source, class_names=names), reason)
    assert not flag.exists()


def test_sources_too_long_to_parse_within_the_bound_are_refused():
    source = hostile_cases.nvidia_source() + '#' * nvidia_pickle.MAX_SOURCE_CHARS
    refused(hostile_cases.nvidia_pickle(hostile_cases.nvidia_networks(), source),
            'a persistent object\'s module_src is not a string of at most 131,072 characters')


def test_storage_and_tensor_bombs_are_refused_before_allocation():
    refused(hostile_cases.nvidia_storage_bomb(1 << 40), 'holds a storage that declares 274,877,906,944 elements of '
                                                        'torch.float32 but carries 16 bytes')
    networks = hostile_cases.nvidia_networks()
    weight = networks['G'].mapping.fc0._parameters['weight']
    # A view reaching beyond its storage, and one repeating an element (stride 0) to look like a large tensor.
    for size, stride in [((8, 9), (8, 1)), ((1 << 20, 1 << 20), (0, 0))]:
        networks['G'].mapping.fc0._parameters['weight'] = _strided(weight, size, stride)
        refused(hostile_cases.nvidia_pickle(networks, hostile_cases.nvidia_source()),
                f'holds a tensor of shape {list(size)} that reaches beyond its storage')


def _strided(tensor: torch.Tensor, size: tuple, stride: tuple) -> object:
    """A tensor pickled as _rebuild_tensor_v2 over `tensor`'s storage with any size and stride (without building it)."""
    storage = tensor.detach().contiguous().untyped_storage()
    return hostile_cases.PickledCall(torch._utils._rebuild_tensor_v2, torch.storage.TypedStorage(
        wrap_storage=storage, dtype=tensor.dtype, _internal=True), 0, size, stride, False, collections.OrderedDict())


def test_deep_nesting_persistent_ids_and_state_are_refused():
    refused(hostile_cases.nvidia_deep_nesting(200_000), 'training_set_kwargs: nested deeper than 32 levels')
    # A persistent id (torch.save's storages use them; NVIDIA's pickle.dump does not).
    refused(b'\x80\x03}X\x01\x00\x00\x00GX\x01\x00\x00\x00xQs.', 'holds a persistent id')  # {'G': persistent id 'x'}
    # BUILD (state set after construction) on a record of a persistent object.
    data = hostile_cases.nvidia_pickle({'G': hostile_cases.nvidia_networks()['G']}, hostile_cases.nvidia_source())
    assert data.endswith(b's.')  # SETITEM, STOP: insert EMPTY_DICT, BUILD on the value (G) before it is set.
    refused(data[:-2] + b'}b' + data[-2:], 'sets the state of a persistent')
    # Positional constructor arguments are not read.
    G = hostile_cases.nvidia_networks()['G']
    refused(hostile_cases.nvidia_pickle({'G': G}, hostile_cases.nvidia_source(), init_args=(8,)),
            'G: training.networks.Generator was built with positional arguments')



#----------------------------------------------------------------------------
# The tools.


def test_generate_calc_metrics_and_legacy_take_nvidia_pickles(tmp_path, monkeypatch):
    monkeypatch.setenv('GNGAN_CACHE_DIR', str(tmp_path / 'cache'))
    networks = hostile_cases.nvidia_networks(c_dim=3, resolution=16)
    path = tmp_path / 'network-snapshot-000100.pkl'
    path.write_bytes(hostile_cases.nvidia_pickle(dict(networks, augment_pipe=None), hostile_cases.nvidia_source()))

    # generate.py at its defaults, as NVIDIA's: their latents (RandomState(seed).randn(z_dim)), const noise, and
    # truncation of every style layer give G's images.
    z = torch.from_numpy(np.stack([np.random.RandomState(s).randn(8) for s in (5, 9)])).float()
    for trunc in ([], ['--trunc=0.5']):
        outdir = tmp_path / f'out{len(trunc)}'
        result = CliRunner().invoke(generate.main, [f'--network={path}', '--seeds=5,9', '--class=2', *trunc,
                                                    f'--outdir={outdir}'])
        assert result.exit_code == 0, result.output
        with torch.no_grad():
            img = networks['G_ema'](z, torch.eye(3)[[2, 2]], truncation_psi=0.5 if trunc else 1, noise_mode='const')
        expected = (img.permute(0, 2, 3, 1) * 127.5 + 128).clamp(0, 255).to(torch.uint8).numpy()
        for i, seed in enumerate((5, 9)):
            assert np.array_equal(np.asarray(PIL.Image.open(outdir / f'seed{seed:04d}.png')), expected[i])

    # calc_metrics.py: IS of its G_ema.
    data = str(tmp_path / 'data.zip')
    write_dataset_zip(data, num_images=10, resolution=16, labels=[i % 3 for i in range(10)])
    detector = str(tmp_path / 'det.pt')
    make_detector(detector)
    result = CliRunner().invoke(calc_metrics.main, [f'--network={path}', '--metrics=is50k', f'--data={data}',
                                                    f'--detector={detector}', '--num-gen=10'])
    assert result.exit_code == 0, result.output
    assert 'is50k_mean' in result.output

    # legacy.load_network routes it; a refused one is one line through generate.py.
    assert type(legacy.load_network(str(path)).G).__name__ == 'Generator'
    evil = tmp_path / 'evil.pkl'
    evil.write_bytes(hostile_cases.nvidia_pickle_calling_os_system(str(tmp_path / 'ran')))
    result = CliRunner().invoke(generate.main, [f'--network={evil}', '--seeds=0', f'--outdir={tmp_path / "x"}'])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert 'names the global posix.system' in result.output and not (tmp_path / 'ran').exists()
    assert not (tmp_path / 'x').exists()

def fine_tune(pickle_path: str, data: str, outdir: str, *args: str, cmax: int = 16, check: bool = True):
    """train.py --resume of an NVIDIA pickle, --cfg=gn-stylegan2 at 16x16 with `cmax` features and z, w of 16, 2 G steps
    of batch 4 at a learning rate that leaves the weights as they came (Adam moves each by at most ~lr per step)."""
    return run_cli('train.py', f'--outdir={outdir}', '--cfg=gn-stylegan2', f'--data={data}', f'--resume={pickle_path}',
                   f'--cmax={cmax}', '--map-dim=16', '--steps=2', '--batch=4', '--glr=1e-12', '--dlr=1e-12', '--tick=0.004',
                   '--snap=1', '--workers=0', *args, check=check)


def assert_started_from(snapshot: dict, networks: dict, names: tuple[str, ...]) -> None:
    for name in names:
        theirs = networks[name].state_dict()
        for key, value in snapshot[name].state_dict().items():
            if key != 'mapping.w_avg':  # Tracked in training mode.
                torch.testing.assert_close(value, theirs[key], rtol=0, atol=1e-9, msg=f'{name}.{key}')


def test_train_resume_fine_tunes_nvidia_networks_with_their_or_a_fresh_d(tmp_path):
    data = str(tmp_path / 'data.zip')
    write_dataset_zip(data, num_images=8, resolution=16)
    G = stylegan2.Generator(z_dim=16, c_dim=0, w_dim=16, img_resolution=16, img_channels=3, mapping_kwargs={'num_layers': 2},
                            synthesis_kwargs={'channel_base': 16384, 'channel_max': 16, 'conv_clamp': 256})
    D = stylegan2.Discriminator(c_dim=0, img_resolution=16, img_channels=3, channel_base=16384, channel_max=16,
                                conv_clamp=256, epilogue_kwargs={'mbstd_group_size': 4})
    torch.manual_seed(1)
    with torch.no_grad():
        for p in [*G.parameters(), *D.parameters()]:
            p.add_(torch.randn_like(p) * 0.1)
    networks = {'G': G, 'G_ema': G, 'D': D}
    path = tmp_path / 'nvidia.pkl'
    path.write_bytes(hostile_cases.nvidia_pickle(dict(networks, augment_pipe=None), hostile_cases.nvidia_source()))

    result = fine_tune(str(path), data, str(tmp_path / 'runs'))
    assert f'Starting from the G, G_ema, D of "{path}"' in result.stdout
    run_dir = only_run_dir(str(tmp_path / 'runs'))
    snapshot = persistence.load_snapshot(os.path.join(run_dir, snapshots(run_dir)[-1]))
    assert snapshot.progress.step == 2 and 'G_opt_state' in snapshot
    assert_started_from(snapshot, networks, ('G', 'G_ema', 'D'))
    assert json.load(open(os.path.join(run_dir, 'training_options.json')))['resume_pkl'] == str(path)

    # --resume-fresh-d: D from scratch (the preset's initialization), G from the pickle.
    result = fine_tune(str(path), data, str(tmp_path / 'fresh'), '--resume-fresh-d')
    assert '(D from scratch)' in result.stdout
    run_dir = only_run_dir(str(tmp_path / 'fresh'))
    snapshot = persistence.load_snapshot(os.path.join(run_dir, snapshots(run_dir)[-1]))
    assert_started_from(snapshot, networks, ('G', 'G_ema'))
    assert (snapshot.D.b16.conv0.weight - D.b16.conv0.weight).abs().max() > 0.05

    # A pickle without D needs --resume-fresh-d; one whose G is not what the run builds names the differing kwargs;
    # --resume-override has no experiment to override.
    no_d = tmp_path / 'no-d.pkl'
    no_d.write_bytes(hostile_cases.nvidia_pickle({'G': G}, hostile_cases.nvidia_source()))
    for args, pickle_path, message in [
            ((), no_d, f'--resume: {no_d} holds no D; add --resume-fresh-d to start D from scratch'),
            (('--map-dim=32',), path, f'--resume: the G of {path} is not the network that --cfg=gn-stylegan2 builds with '
                                      f'these options for this data; its kwargs differ: w_dim 16 (this run: 32), z_dim 16 '
                                      f'(this run: 32)'),
            (('--resume-override',), path, f'--resume-override: {path} is NVIDIA\'s pickle, which records no experiment')]:
        result = fine_tune(str(pickle_path), data, str(tmp_path / 'refused'), *args, check=False)
        assert result.returncode == 1 and result.stderr.strip().splitlines()[-1].startswith(f'Error: {message}'), \
            result.stderr[-2000:]
    assert not (tmp_path / 'refused').exists()

#----------------------------------------------------------------------------
# NVIDIA's own code.

_NVIDIA_SCRIPT = r'''
import copy, json, os, pickle, sys, types
import numpy as np, torch
checkout, out, c_dim = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    import pkg_resources  # noqa: F401  (their StyleGAN3 ops import it; setuptools may be absent)
except ImportError:
    import packaging.version
    sys.modules['pkg_resources'] = types.SimpleNamespace(parse_version=packaging.version.parse)
sys.path.insert(0, checkout)
import dnnlib
from training.augment import AugmentPipe
stylegan3 = os.path.isfile(os.path.join(checkout, 'training', 'networks_stylegan2.py'))
if stylegan3:  # Their train.py's kwargs, their defaults left to their code (num_fp16_res, conv_clamp, w_avg_beta).
    from training import networks_stylegan2 as networks
    G = networks.Generator(z_dim=16, c_dim=c_dim, w_dim=16, img_resolution=16, img_channels=3,
                           mapping_kwargs=dnnlib.EasyDict(num_layers=2), channel_base=16384, channel_max=32,
                           fused_modconv_default='inference_only')
    D = networks.Discriminator(c_dim=c_dim, img_resolution=16, img_channels=3, channel_base=16384, channel_max=32,
                               block_kwargs=dnnlib.EasyDict(), mapping_kwargs=dnnlib.EasyDict(),
                               epilogue_kwargs=dnnlib.EasyDict(mbstd_group_size=2))
else:  # float32 blocks: their StyleGAN2-ADA would compute float16 blocks in float16 on the CPU.
    from training import networks
    G = networks.Generator(z_dim=16, c_dim=c_dim, w_dim=16, img_resolution=16, img_channels=3,
                           mapping_kwargs=dnnlib.EasyDict(num_layers=2),
                           synthesis_kwargs=dnnlib.EasyDict(channel_base=16384, channel_max=32, num_fp16_res=0, conv_clamp=256))
    D = networks.Discriminator(c_dim=c_dim, img_resolution=16, img_channels=3, channel_base=16384, channel_max=32,
                               block_kwargs=dnnlib.EasyDict(), mapping_kwargs=dnnlib.EasyDict(),
                               epilogue_kwargs=dnnlib.EasyDict(mbstd_group_size=2))
torch.manual_seed(0)
with torch.no_grad():  # Off their initial values: zero biases, noise strengths and w_avg would hide terms.
    for t in [*G.parameters(), G.mapping.w_avg, *D.parameters()]:
        t.add_(torch.randn_like(t) * 0.2)
G_ema = copy.deepcopy(G)
with torch.no_grad():
    for p in G_ema.parameters():
        p.mul_(0.5)
snapshot = dict(training_set_kwargs=dict(dnnlib.EasyDict(class_name='training.dataset.ImageFolderDataset', path='data.zip',
                                                          use_labels=c_dim > 0, max_size=8, xflip=False, resolution=16)))
for name, module in [('G', G), ('D', D), ('G_ema', G_ema), ('augment_pipe', AugmentPipe(xflip=1, rotate90=1, xint=1))]:
    snapshot[name] = copy.deepcopy(module).eval().requires_grad_(False).cpu()
with open(os.path.join(out, 'nvidia.pkl'), 'wb') as f:
    pickle.dump(snapshot, f)
# What their modules report: kwargs (plain, through JSON) and state dicts.
with open(os.path.join(out, 'kwargs.json'), 'w') as f:
    json.dump({name: snapshot[name].init_kwargs for name in ('G', 'D', 'G_ema')}, f)
torch.save({name: snapshot[name].state_dict() for name in ('G', 'D', 'G_ema')}, os.path.join(out, 'state.pt'))
# Their generate.py: z = RandomState(seed).randn(1, z_dim), label one-hot, noise_mode const (its default).
c = torch.zeros([1, c_dim]); c[:, c_dim - 1:] = 1
G_ema = snapshot['G_ema']
images = [G_ema(torch.from_numpy(np.random.RandomState(seed).randn(1, 16)).float(), c, truncation_psi=psi, noise_mode='const')
          for seed, psi in [(3, 1), (11, 1), (3, 0.6)]]
np.save(os.path.join(out, 'images.npy'), torch.cat(images).numpy())
img = torch.from_numpy(np.random.RandomState(1).randn(4, 3, 16, 16)).float()
np.save(os.path.join(out, 'logits.npy'), snapshot['D'](img, c.expand(4, -1)).numpy())
'''


@pytest.mark.skipif(not NVIDIA_CODE, reason='GNGAN_NVIDIA_CODE does not name a checkout of NVIDIA\'s StyleGAN2 code')
@pytest.mark.parametrize('c_dim', [0, 3])
def test_pickle_of_nvidia_code_gives_their_images_through_generate_and_trains(c_dim, tmp_path):
    script = tmp_path / 'theirs.py'
    script.write_text(textwrap.dedent(_NVIDIA_SCRIPT))
    result = subprocess.run([sys.executable, str(script), NVIDIA_CODE, str(tmp_path), str(c_dim)], capture_output=True,
                            text=True, env=dict(os.environ, CUDA_VISIBLE_DEVICES='', PYTHONDONTWRITEBYTECODE='1'), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    path = tmp_path / 'nvidia.pkl'
    theirs = np.load(tmp_path / 'images.npy')
    outdir = tmp_path / 'out'
    args = [f'--network={path}', f'--outdir={outdir}'] + (['--class=2'] if c_dim else [])  # NVIDIA's defaults.
    for seeds, trunc in [('3,11', []), ('3', ['--trunc=0.6'])]:
        result = CliRunner().invoke(generate.main, args + [f'--seeds={seeds}', *trunc])
        assert result.exit_code == 0, result.output
        assert 'dropped augment_pipe (training.augment.AugmentPipe)' in result.output
        for i, seed in enumerate(seeds.split(',')):
            expected = theirs[[0, 1] if not trunc else [2]][i]
            expected = (torch.from_numpy(expected).permute(1, 2, 0) * 127.5 + 128).clamp(0, 255).to(torch.uint8).numpy()
            ours = np.asarray(PIL.Image.open(outdir / f'seed{int(seed):04d}.png')).astype(int)
            assert np.abs(ours - expected).max() <= 1 and (ours != expected).mean() < 0.01  # float rounding at .5 edges

    # The networks: their kwargs (the StyleGAN3 repository's nested, its defaults written out) and exactly their tensors,
    # in their order; images and logits to float32 rounding.
    loaded = legacy.load_network(str(path))
    kwargs, state = json.load(open(tmp_path / 'kwargs.json')), torch.load(tmp_path / 'state.pt', weights_only=True)
    if 'synthesis_kwargs' not in kwargs['G']:  # StyleGAN3 repository.
        synthesis = {k: kwargs['G'].pop(k) for k in list(kwargs['G']) if k not in
                     ('z_dim', 'c_dim', 'w_dim', 'img_resolution', 'img_channels', 'mapping_kwargs')}
        kwargs['G']['synthesis_kwargs'] = dict(synthesis, num_fp16_res=4, conv_clamp=256)
        kwargs['G']['mapping_kwargs']['w_avg_beta'] = 0.998
        kwargs['G_ema'] = kwargs['G']
        kwargs['D'].update(num_fp16_res=4, conv_clamp=256)
    for name in ('G', 'D', 'G_ema'):
        assert loaded[name].init_kwargs == kwargs[name]
        assert list(loaded[name].state_dict()) == list(state[name])
        assert all(torch.equal(loaded[name].state_dict()[key], value) for key, value in state[name].items())
    c = torch.zeros([1, c_dim])
    c[:, c_dim - 1:] = 1
    with torch.no_grad():
        z = torch.from_numpy(np.random.RandomState(11).randn(1, 16)).float()
        torch.testing.assert_close(loaded.G_ema(z, c, noise_mode='const'), torch.from_numpy(theirs[1:2]), rtol=0, atol=1e-5)
        img = torch.from_numpy(np.random.RandomState(1).randn(4, 3, 16, 16)).float()
        torch.testing.assert_close(loaded.D(img, c.expand(4, -1)), torch.from_numpy(np.load(tmp_path / 'logits.npy')),
                                   rtol=1e-5, atol=1e-5)
    assert loaded.training_set_kwargs.path == 'data.zip'

    # train.py --resume: --cfg=gn-stylegan2 (its auto configuration at 16x16: 2 mapping layers, channel_base 16384)
    # fine-tunes their G with their D.
    data = str(tmp_path / 'data.zip')
    write_dataset_zip(data, num_images=8, resolution=16, labels=[i % 3 for i in range(8)] if c_dim else None)
    fine_tune(str(path), data, str(tmp_path / 'runs'), cmax=32)
    run_dir = only_run_dir(str(tmp_path / 'runs'))
    assert_started_from(persistence.load_snapshot(os.path.join(run_dir, snapshots(run_dir)[-1])), loaded, ('G', 'D'))

#----------------------------------------------------------------------------
# Files made to take memory or time, or to break the reader (bench/hostile_cases.py's variants): one line each, before
# what they would expand to is made. Their memory and time through the entry points: tests/test_hostile_files.py.


@pytest.mark.parametrize('variant', list(hostile_cases.nvidia_variants()))
def test_variants_are_refused_in_one_line(variant, tmp_path):
    make, reason = hostile_cases.nvidia_variants(scale=1 << 20)[variant]
    refused(make(), reason)


def test_text_of_the_file_is_printed_escaped_on_one_line():
    """A global's name and a dropped entry's name holding a newline and terminal escape codes (clear the screen, red)."""
    escape = '\n\x1b[2J\x1b[31m'
    name = f'system{escape}'.encode()
    # {'G': <global os.<name>>()}: PROTO 4, EMPTY_DICT, the key, module and name (SHORT_BINUNICODE), STACK_GLOBAL,
    # EMPTY_TUPLE, REDUCE, SETITEM, STOP.
    data = b'\x80\x04}\x8c\x01G\x8c\x02os\x8c' + bytes([len(name)]) + name + b'\x93)Rs.'
    message = refused(data, 'names the global os.system\\n\\x1b[2J\\x1b[31m, which is not read')
    assert message.isprintable()
    networks = hostile_cases.nvidia_networks()
    loaded, dropped = load(hostile_cases.nvidia_pickle({**networks, f'extra{escape}' + 'x' * 1000: 1}, hostile_cases.nvidia_source()))
    assert dropped == ['nvidia.pkl: dropped extra\\n\\x1b[2J\\x1b[31m' + 'x' * 85 + '... (int): this project does not use it']
    assert sorted(loaded) == ['D', 'G', 'G_ema', 'training_set_kwargs']
    # A message of this project's checks that quotes the file's text (training_set_kwargs naming a class not built).
    loaded, dropped = load(hostile_cases.nvidia_pickle({**networks, 'training_set_kwargs': {'class_name': f'evil{escape[1:]}'}},
                                                       hostile_cases.nvidia_source()))
    assert loaded.training_set_kwargs is None and len(dropped) == 1
    assert dropped[0].startswith('nvidia.pkl: dropped training_set_kwargs: "evil\\x1b[2J\\x1b[31m" is not a class this '
                                 'project builds by name') and dropped[0].isprintable()


def test_globals_in_a_storage_are_refused_unrun(tmp_path):
    """The pickles inside a storage's bytes have their own unpickler, which names only torch's storage types."""
    flag = tmp_path / 'ran'
    f = io.BytesIO()
    pickle.dump(hostile_cases.PickledCall(os.system, f'touch {flag}'), f, protocol=2)  # In place of the magic number.
    networks = hostile_cases.nvidia_networks()
    networks['G'].mapping._buffers['w_avg'] = hostile_cases.PickledCall(
        torch._utils._rebuild_tensor_v2, hostile_cases.PickledCall(torch.storage._load_from_bytes, f.getvalue()), 0, (8,), (1,),
        False, collections.OrderedDict())
    refused(hostile_cases.nvidia_pickle(networks, hostile_cases.nvidia_source()),
            'names the global posix.system in a storage, which is not read')
    assert not flag.exists()


def test_large_networks_are_read(tmp_path):
    """A 1024x1024 generator (9 synthesis blocks, as many layers and tensors as NVIDIA's config F, fewer channels) and its
    discriminator are within every bound: their tensors are in the file."""
    networks = {}
    torch.manual_seed(0)
    networks['G'] = stylegan2.Generator(z_dim=32, c_dim=0, w_dim=32, img_resolution=1024, img_channels=3,
                                        mapping_kwargs={'num_layers': 8}, synthesis_kwargs={'channel_base': 4096, 'channel_max': 64})
    networks['D'] = stylegan2.Discriminator(c_dim=0, img_resolution=1024, img_channels=3, channel_base=4096, channel_max=64)
    loaded, _ = load(hostile_cases.nvidia_pickle(networks, hostile_cases.nvidia_source()))
    for name in ('G', 'D'):
        theirs = networks[name].state_dict()
        assert list(loaded[name].state_dict()) == list(theirs) and len(theirs) > {"G": 150, "D": 80}[name]
        assert all(torch.equal(value, theirs[key]) for key, value in loaded[name].state_dict().items())


def test_sigterm_while_train_reads_the_pickle_stops_it(tmp_path, monkeypatch, capsys):
    """train.py --resume of NVIDIA's pickle: SIGTERM while its storages are read stops the command there (exit 75, one
    line), before the rest of the file is read and before anything of the run is written."""
    import signal
    from training import intake
    from training.run.stop_signal import StopSignal
    path = tmp_path / 'nvidia.pkl'
    path.write_bytes(hostile_cases.nvidia_pickle(hostile_cases.nvidia_networks(), hostile_cases.nvidia_source()))
    read, load_storage = [], nvidia_pickle._load_storage

    def signal_at_the_third(load_state, blob):
        read.append(blob)
        if len(read) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return load_storage(load_state, blob)
    monkeypatch.setattr(nvidia_pickle, '_load_storage', signal_at_the_third)
    opts = dict(resume=str(path), resume_fresh_d=False, resume_override=False)
    with StopSignal() as stop, pytest.raises(SystemExit) as info:
        intake.load_nvidia(dnnlib.EasyDict(opts), stop)
    assert info.value.code == 75
    assert capsys.readouterr().err == f'Stopped by SIGTERM while reading --resume={path}; nothing was started\n'
    assert len(read) == 3  # The storage in progress is read; none after it.


@pytest.mark.parametrize('key,what', [('z_dim', 'latent dimension'), ('c_dim', 'label dimension'),
                                      ('w_dim', 'style dimension')])
def test_each_input_dimension_is_bounded_by_the_elements_of_the_networks_tensors(key, what):
    """z_dim, c_dim and w_dim size what running G allocates: one more than the elements of G's tensors is refused,
    naming the dimension; the elements are counted here from the networks written (parameters and buffers)."""
    networks = hostile_cases.nvidia_networks(resolution=16)
    G = networks['G']
    elements = sum(t.numel() for t in [*G.parameters(), *G.buffers()])
    kwargs = dict(z_dim=8, c_dim=0, w_dim=8, img_resolution=16, img_channels=3, mapping_kwargs={'num_layers': 2},
                  synthesis_kwargs={'channel_base': 128, 'channel_max': 16})
    for value, refused in [(elements + 1, True), (elements, False)]:
        object.__setattr__(G, 'init_kwargs', dict(kwargs, **{key: value}))
        with pytest.raises(nvidia_pickle.NvidiaPickleError) as error:  # At `elements` G's own shapes refuse it.
            load(hostile_cases.nvidia_pickle({'G': G}, hostile_cases.nvidia_source()))
        message = f'asks for a {what} ({key}) of {value:,}, more than the {elements:,} elements its tensors hold'
        assert (message in str(error.value)) == refused, str(error.value)
