"""Tests of legacy.py: checkpoints of the official GN-GAN code become our networks.

The official state dicts are built here from their key names and shapes (as models/dcgan.py,
resnet.py and biggan.py of basiclab/GNGAN-PyTorch define them), filled with random values, and
their forward pass is computed by a functional transcription of the official modules (eval mode:
batch norm on running statistics, spectral norm with the stored u and v). The converted networks,
saved as a snapshot and loaded back, must give the same outputs; the official parameter counts
must be those of the paper's released models (the GN-GAN release's checkpoints, basiclab/GNGAN-PyTorch).
"""

import io
import os
import zipfile

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

import calc_metrics
import generate
import legacy
from tests.support.stand_ins import make_detector, write_dataset_zip
from torch_utils import persistence

#----------------------------------------------------------------------------
# Official key names and shapes. A layer is (kind, shapes...): 'conv'/'convT'/'linear' (weight, bias),
# 'sn' (old-style spectral norm: weight_orig, bias, weight_u, weight_v), 'bn' (affine), 'bn0'
# (no affine), 'emb' (nn.Embedding weight).


def conv(cin, cout, k):
    return ('conv', [cout, cin, k, k])


def layers_to_shapes(layers: dict) -> dict:
    shapes = {}
    for name, (kind, *args) in layers.items():
        if kind in ('conv', 'convT', 'linear'):
            shapes[f'{name}.weight'] = args[0]
            shapes[f'{name}.bias'] = [args[0][1] if kind == 'convT' else args[0][0]]
        elif kind == 'sn':
            w = args[0]
            shapes.update({f'{name}.weight_orig': w, f'{name}.bias': [w[0]], f'{name}.weight_u': [w[0]],
                           f'{name}.weight_v': [int(np.prod(w[1:]))]})
        elif kind in ('bn', 'bn0'):
            c = args[0]
            if kind == 'bn':
                shapes.update({f'{name}.weight': [c], f'{name}.bias': [c]})
            shapes.update({f'{name}.running_mean': [c], f'{name}.running_var': [c], f'{name}.num_batches_tracked': []})
        elif kind == 'emb':
            shapes[f'{name}.weight'] = args[0]
    return shapes


def cnn_G(M):
    # main: BN 0, ReLU 1, ConvT 2, BN 3, ReLU 4, ConvT 5, BN 6, ReLU 7, ConvT 8, BN 9, ReLU 10, ConvT 11, Tanh 12.
    return {'linear': ('linear', [M * M * 512, 128]), 'main.0': ('bn', 512), 'main.2': ('convT', [512, 256, 4, 4]),
            'main.3': ('bn', 256), 'main.5': ('convT', [256, 128, 4, 4]), 'main.6': ('bn', 128),
            'main.8': ('convT', [128, 64, 4, 4]), 'main.9': ('bn', 64), 'main.11': ('convT', [64, 3, 3, 3])}


def cnn_D(M):
    chans = [(3, 64, 3), (64, 128, 4), (128, 128, 3), (128, 256, 4), (256, 256, 3), (256, 512, 4), (512, 512, 3)]
    layers = {f'main.{2 * i}': conv(*c) for i, c in enumerate(chans)}
    layers['linear'] = ('linear', [1, (M // 8) ** 2 * 512])
    return layers


RESNET = {  # resolution: (G widths, G bottom, D widths, D down flags after the first block)
    32: ([256, 256, 256, 256], 4, [128, 128, 128, 128], [True, False, False]),
    48: ([512, 256, 128, 64], 6, [64, 128, 256, 512], [True, True, True]),
    128: ([1024, 1024, 512, 256, 128, 64], 4, [64, 128, 256, 512, 1024, 1024], [True, True, True, True, False]),
    256: ([1024, 1024, 512, 512, 256, 128, 64], 4, [64, 128, 256, 512, 512, 1024, 1024], [True] * 5 + [False]),
}


def resnet_G(res):
    widths, bottom, _, _ = RESNET[res]
    layers = {'linear': ('linear', [bottom * bottom * widths[0], 128])}
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.update({f'blocks.{i}.residual.0': ('bn', a), f'blocks.{i}.residual.3': conv(a, b, 3),
                       f'blocks.{i}.residual.4': ('bn', b), f'blocks.{i}.residual.6': conv(b, b, 3),
                       f'blocks.{i}.shortcut.1': conv(a, b, 1)})
    layers.update({'output.0': ('bn', widths[-1]), 'output.2': conv(widths[-1], 3, 3)})
    return layers


def resnet_D(widths, downs, container='model'):
    layers = {f'{container}.0.residual.0': conv(3, widths[0], 3), f'{container}.0.residual.2': conv(widths[0], widths[0], 3),
              f'{container}.0.shortcut.1': conv(3, widths[0], 1)}
    for i, (a, b, down) in enumerate(zip(widths[:-1], widths[1:], downs), start=1):
        layers.update({f'{container}.{i}.residual.1': conv(a, b, 3), f'{container}.{i}.residual.3': conv(b, b, 3)})
        if a != b or down:
            layers[f'{container}.{i}.shortcut.0'] = conv(a, b, 1)
    layers['linear'] = ('linear', [1, widths[-1]])
    return layers


def biggan_G(n_classes, ch=256):
    layers = {'linear': ('sn', [4 * 4 * ch, 128])}
    for i in range(3):
        for n in (1, 2):
            layers.update({f'blocks.{i}.bn{n}.gain': ('emb', [n_classes, ch]), f'blocks.{i}.bn{n}.bias': ('emb', [n_classes, ch]),
                           f'blocks.{i}.bn{n}.batchnorm2d': ('bn0', ch)})
        layers.update({f'blocks.{i}.residual1.2': ('sn', [ch, ch, 3, 3]), f'blocks.{i}.residual2.1': ('sn', [ch, ch, 3, 3]),
                       f'blocks.{i}.shortcut.1': ('sn', [ch, ch, 1, 1])})
    layers.update({'output_layer.0': ('bn', ch), 'output_layer.2': ('sn', [3, ch, 3, 3])})
    return layers


def biggan_D(n_classes, ch=256):
    layers = resnet_D([ch] * 4, [True, False, False], container='blocks')
    layers['embedding'] = ('emb', [n_classes, ch])
    return layers


def official_layers(cfg: str, n_classes: int = 10) -> tuple[dict, dict]:
    return {
        'cifar10-cnn': lambda: (cnn_G(4), cnn_D(32)),
        'stl10-cnn': lambda: (cnn_G(6), cnn_D(48)),
        'cifar10-resnet': lambda: (resnet_G(32), resnet_D(*RESNET[32][2:])),
        'stl10-resnet': lambda: (resnet_G(48), resnet_D(*RESNET[48][2:])),
        'celebahq128-resnet': lambda: (resnet_G(128), resnet_D(*RESNET[128][2:])),
        'church256-resnet': lambda: (resnet_G(256), resnet_D(*RESNET[256][2:])),
        'cifar10-biggan': lambda: (biggan_G(n_classes), biggan_D(n_classes)),
    }[cfg]()


def random_state(layers: dict, gen: torch.Generator) -> dict:
    """Random values; running variances and spectral-norm vectors positive-ish and well scaled."""
    state = {}
    for key, shape in layers_to_shapes(layers).items():
        if key.endswith('num_batches_tracked'):
            state[key] = torch.tensor(1000)
        elif key.endswith('running_var'):
            state[key] = torch.rand(shape, generator=gen) + 0.5
        elif key.endswith(('weight_u', 'weight_v')):
            state[key] = F.normalize(torch.randn(shape, generator=gen), dim=0)
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            state[key] = torch.randn(shape, generator=gen) / np.sqrt(fan_in) * (0.2 if 'bn' in key or 'gain' in key else 1)
    return state


def num_params(layers: dict) -> int:
    buffers = ('running_mean', 'running_var', 'num_batches_tracked', 'weight_u', 'weight_v')
    return sum(int(np.prod(shape)) for key, shape in layers_to_shapes(layers).items() if not key.endswith(buffers))

#----------------------------------------------------------------------------
# The official forward passes, transcribed functionally (eval mode).


def bn(s, name, x):
    return F.batch_norm(x, s[f'{name}.running_mean'], s[f'{name}.running_var'], s.get(f'{name}.weight'),
                        s.get(f'{name}.bias'), training=False, eps=1e-5)


def sn_weight(s, name):
    w = s[f'{name}.weight_orig']
    sigma = s[f'{name}.weight_u'] @ (w.reshape(w.shape[0], -1) @ s[f'{name}.weight_v'])
    return w / sigma


def cv(s, name, x, padding=None, sn=False):
    w = sn_weight(s, name) if sn else s[f'{name}.weight']
    return F.conv2d(x, w, s[f'{name}.bias'], padding=w.shape[-1] // 2 if padding is None else padding)


def lin(s, name, x, sn=False):
    return F.linear(x, sn_weight(s, name) if sn else s[f'{name}.weight'], s[f'{name}.bias'])


def up(x):
    return F.interpolate(x, scale_factor=2, mode='nearest')


def official_cnn_G(s, z, M):
    x = lin(s, 'linear', z).view(len(z), 512, M, M)
    for b, t in [(0, 2), (3, 5), (6, 8)]:
        x = F.conv_transpose2d(F.relu(bn(s, f'main.{b}', x)), s[f'main.{t}.weight'], s[f'main.{t}.bias'], stride=2, padding=1)
    x = F.relu(bn(s, 'main.9', x))
    return torch.tanh(F.conv_transpose2d(x, s['main.11.weight'], s['main.11.bias'], stride=1, padding=1))


def official_cnn_D(s, x):
    for i in range(7):
        w = s[f'main.{2 * i}.weight']
        x = F.leaky_relu(F.conv2d(x, w, s[f'main.{2 * i}.bias'], stride=2 if w.shape[-1] == 4 else 1, padding=1), 0.1)
    return lin(s, 'linear', x.flatten(1))


def official_resnet_G(s, z, res):
    widths, bottom, _, _ = RESNET[res]
    x = lin(s, 'linear', z).view(len(z), widths[0], bottom, bottom)
    for i in range(len(widths) - 1):
        h = cv(s, f'blocks.{i}.residual.3', up(F.relu(bn(s, f'blocks.{i}.residual.0', x))))
        h = cv(s, f'blocks.{i}.residual.6', F.relu(bn(s, f'blocks.{i}.residual.4', h)))
        x = h + cv(s, f'blocks.{i}.shortcut.1', up(x))
    return torch.tanh(cv(s, 'output.2', F.relu(bn(s, 'output.0', x))))


def official_resnet_D_features(s, x, downs, container):
    # Optimized block: the shortcut pools first, then its 1x1 conv.
    h = F.avg_pool2d(cv(s, f'{container}.0.residual.2', F.relu(cv(s, f'{container}.0.residual.0', x))), 2)
    x = h + cv(s, f'{container}.0.shortcut.1', F.avg_pool2d(x, 2))
    for i, down in enumerate(downs, start=1):
        h = cv(s, f'{container}.{i}.residual.3', F.relu(cv(s, f'{container}.{i}.residual.1', F.relu(x))))
        sc = cv(s, f'{container}.{i}.shortcut.0', x) if f'{container}.{i}.shortcut.0.weight' in s else x
        if down:
            h, sc = F.avg_pool2d(h, 2), F.avg_pool2d(sc, 2)
        x = h + sc
    return F.relu(x)


def official_resnet_D(s, x, res):
    return lin(s, 'linear', official_resnet_D_features(s, x, RESNET[res][3], 'model').mean(dim=[2, 3]))


def official_biggan_G(s, z, y):
    def cbn(name, x):
        return bn(s, f'{name}.batchnorm2d', x) * (1 + s[f'{name}.gain.weight'][y][:, :, None, None]) + \
            s[f'{name}.bias.weight'][y][:, :, None, None]
    x = lin(s, 'linear', z, sn=True).view(len(z), -1, 4, 4)
    for i in range(3):
        h = cv(s, f'blocks.{i}.residual1.2', up(F.relu(cbn(f'blocks.{i}.bn1', x))), sn=True)
        h = cv(s, f'blocks.{i}.residual2.1', F.relu(cbn(f'blocks.{i}.bn2', h)), sn=True)
        x = h + cv(s, f'blocks.{i}.shortcut.1', up(x), sn=True)
    return torch.tanh(cv(s, 'output_layer.2', F.relu(bn(s, 'output_layer.0', x)), sn=True))


def official_biggan_D(s, x, y):
    h = official_resnet_D_features(s, x, [True, False, False], 'blocks').sum(dim=[2, 3])
    return lin(s, 'linear', h) + (s['embedding.weight'][y] * h).sum(dim=1, keepdim=True)


def official_forward(cfg, state_G, state_D, z, y, img):
    if cfg.endswith('cnn'):
        M = 4 if cfg.startswith('cifar10') else 6
        return official_cnn_G(state_G, z, M), official_cnn_D(state_D, img)
    if cfg.endswith('resnet'):
        res = {'cifar10': 32, 'stl10': 48}[cfg.split('-')[0]]
        return official_resnet_G(state_G, z, res), official_resnet_D(state_D, img, res)
    return official_biggan_G(state_G, z, y), official_biggan_D(state_D, img, y)

#----------------------------------------------------------------------------


def official_checkpoint(cfg: str, seed: int = 0, n_classes: int = 10) -> dict:
    """A checkpoint as the official train.py saves it, with random networks and an Adam state."""
    gen = torch.Generator().manual_seed(seed)
    layers_G, layers_D = official_layers(cfg, n_classes)
    net_G, ema_G, net_D = random_state(layers_G, gen), random_state(layers_G, gen), random_state(layers_D, gen)
    optim = {'state': {0: {'step': 5, 'exp_avg': torch.zeros(3), 'exp_avg_sq': torch.zeros(3)}},
             'param_groups': [{'lr': 2e-4, 'betas': (0.0, 0.9), 'eps': 1e-8, 'weight_decay': 0, 'amsgrad': False, 'params': [0]}]}
    sched = {'base_lrs': [2e-4], 'last_epoch': 10, '_step_count': 11, 'verbose': False, 'lr_lambdas': [None]}
    return {'net_G': net_G, 'net_D': net_D, 'ema_G': ema_G, 'optim_G': optim, 'optim_D': optim, 'sched_G': sched,
            'sched_D': sched, 'fixed_z': torch.randn(4, 128, generator=gen), 'fixed_y': torch.zeros(4, dtype=torch.long),
            'best_IS': np.float64(7.5), 'best_FID': np.float64(12.25), 'step': 10}


PARAM_COUNTS = {  # Parameter counts of the models of the GN-GAN release (basiclab/GNGAN-PyTorch).
    'cifar10-cnn': (3813379, 5860865), 'stl10-cnn': (5134339, 5871105),
    'cifar10-resnet': (4276739, 1053825), 'stl10-resnet': (4878083, 4859073),
    'celebahq128-resnet': (32150787, 38419137), 'church256-resnet': (37135107, 43401409),
    'cifar10-biggan': (4304387, 4207361),
}


@pytest.mark.parametrize('cfg', list(PARAM_COUNTS))
def test_official_layouts_have_the_paper_parameter_counts(cfg):
    layers_G, layers_D = official_layers(cfg)
    assert (num_params(layers_G), num_params(layers_D)) == PARAM_COUNTS[cfg]


@pytest.mark.parametrize('cfg', ['cifar10-cnn', 'stl10-cnn', 'cifar10-resnet', 'stl10-resnet', 'cifar10-biggan'])
def test_conversion_places_every_tensor_and_matches_the_official_forward(cfg, tmp_path):
    torch.manual_seed(1)
    checkpoint = official_checkpoint(cfg)
    nets = legacy.convert_official_checkpoint(checkpoint, cfg)
    assert set(nets) == {'G', 'G_ema', 'D'}
    # Every official tensor is in our state dict, unchanged (or transposed, for the class embeddings).
    for official, ours in [('net_G', 'G'), ('ema_G', 'G_ema'), ('net_D', 'D')]:
        values = sorted(round(float(v.double().abs().sum()), 3) for v in checkpoint[official].values())
        assert sorted(round(float(v.double().abs().sum()), 3) for v in nets[ours].state_dict().values()) == values
        assert len(nets[ours].state_dict()) == len(checkpoint[official])

    path = str(tmp_path / 'converted.pkl')
    persistence.save_snapshot(path, dict(nets))
    snapshot = persistence.load_snapshot(path)
    z = torch.randn(3, 128)
    y = torch.tensor([2, 7, 2])
    res = nets.G.img_resolution
    img = torch.randn(3, 3, res, res)
    c = F.one_hot(y, 10).float() if cfg.endswith('biggan') else torch.zeros(3, 0)
    with torch.no_grad():
        for official in ('net_G', 'ema_G'):
            expected_img, expected_logits = official_forward(cfg, checkpoint[official], checkpoint['net_D'], z, y, img)
            G = snapshot.G if official == 'net_G' else snapshot.G_ema
            torch.testing.assert_close(G(z, c), expected_img, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(snapshot.D(img, c), expected_logits, rtol=1e-4, atol=1e-4)
        assert expected_img.std() > 0.05  # Not a degenerate (saturated or constant) comparison.


def test_ddp_checkpoint_of_128x128_resnet_converts():
    # train_ddp.py saves DistributedDataParallel state dicts: every key starts with "module.".
    gen = torch.Generator().manual_seed(0)
    layers_G, layers_D = official_layers('celebahq128-resnet')
    state_G = {f'module.{k}': v for k, v in random_state(layers_G, gen).items()}
    state_D = {f'module.{k}': v for k, v in random_state(layers_D, gen).items()}
    nets = legacy.convert_official_checkpoint(dict(ema_G=state_G, net_D=state_D), 'celebahq128-resnet')
    assert set(nets) == {'G_ema', 'D'}
    torch.testing.assert_close(nets.G_ema.state_dict()['blocks.4.conv2.weight'], state_G['module.blocks.4.residual.6.weight'])
    torch.testing.assert_close(nets.D.state_dict()['blocks.5.conv1.bias'], state_D['module.model.5.residual.1.bias'])


def test_mismatched_or_foreign_checkpoints_are_refused():
    checkpoint = official_checkpoint('cifar10-resnet')
    with pytest.raises(legacy.OfficialCheckpointError, match='shape') as info:
        legacy.convert_official_checkpoint(checkpoint, 'stl10-resnet')
    assert '\n' not in str(info.value)
    with pytest.raises(legacy.OfficialCheckpointError, match='unexpected entry'):
        legacy.convert_official_checkpoint(dict(checkpoint, net_D=dict(checkpoint['net_D'], extra=torch.zeros(1))), 'cifar10-resnet')
    missing = dict(checkpoint['net_G'])
    del missing['blocks.1.residual.4.running_var']
    with pytest.raises(legacy.OfficialCheckpointError, match='no tensor for 1 entries'):
        legacy.convert_official_checkpoint(dict(checkpoint, net_G=missing), 'cifar10-resnet')
    with pytest.raises(legacy.OfficialCheckpointError, match='not an official'):
        legacy.convert_official_checkpoint(dict(G=1), 'cifar10-resnet')
    with pytest.raises(legacy.OfficialCheckpointError, match='--cfg=gn-stylegan'):
        legacy.convert_official_checkpoint(checkpoint, 'gn-stylegan')


def save_with_numpy1_names(checkpoint: dict, path: str) -> None:
    """torch.save, with the NumPy scalars named as NumPy 1 (the official code's) pickles name them."""
    buf = io.BytesIO()
    torch.save(checkpoint, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as zin, zipfile.ZipFile(path, 'w') as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith('data.pkl'):
                assert b'numpy._core.multiarray' in data
                data = data.replace(b'numpy._core.multiarray', b'numpy.core.multiarray')
            zout.writestr(info, data)


def test_generate_and_calc_metrics_take_official_checkpoints(tmp_path, monkeypatch):
    monkeypatch.setenv('GNGAN_CACHE_DIR', str(tmp_path / 'cache'))
    checkpoint = official_checkpoint('cifar10-biggan')
    path = str(tmp_path / 'best_model.pt')
    save_with_numpy1_names(checkpoint, path)

    outdir = tmp_path / 'out'
    result = CliRunner().invoke(generate.main, [f'--network={path}', '--cfg=cifar10-biggan', '--seeds=0-1', '--class=3',
                                                f'--outdir={outdir}'])
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(outdir)) == ['seed0000.png', 'seed0001.png']

    # Without --cfg: one line naming the option.
    result = CliRunner().invoke(generate.main, [f'--network={path}', f'--outdir={tmp_path / "x"}'])
    assert result.exit_code == 1 and '--cfg' in result.output and len(result.output.strip().splitlines()) == 1

    # calc_metrics: IS of the converted G_ema, labels drawn from a 10-class dataset.
    data = str(tmp_path / 'data.zip')
    write_dataset_zip(data, num_images=10, resolution=32, labels=list(range(10)))
    detector = str(tmp_path / 'det.pt')
    make_detector(detector)
    result = CliRunner().invoke(calc_metrics.main, [f'--network={path}', '--cfg=cifar10-biggan', '--metrics=is50k',
                                                    f'--data={data}', f'--detector={detector}', '--num-gen=10'])
    assert result.exit_code == 0, result.output
    assert 'is50k_mean' in result.output

    # The converter command writes one of our snapshots.
    dest = str(tmp_path / 'converted.pkl')
    result = CliRunner().invoke(legacy.main, [f'--source={path}', '--cfg=cifar10-biggan', f'--dest={dest}'])
    assert result.exit_code == 0, result.output
    snapshot = persistence.load_snapshot(dest)
    torch.testing.assert_close(snapshot.G.state_dict()['blocks.2.norm1.gain.weight'],
                               checkpoint['net_G']['blocks.2.bn1.gain.weight'].t())


def test_checkpoint_naming_code_is_refused_unrun(tmp_path):
    class Payload:
        def __reduce__(self):
            return (os.system, ('touch ' + str(tmp_path / 'pwned'),))
    path = str(tmp_path / 'evil.pt')
    torch.save({'net_G': {}, 'x': Payload()}, path)
    with pytest.raises(legacy.OfficialCheckpointError, match='refused to load'):
        legacy.load_official_checkpoint(path, 'cifar10-resnet')
    assert not (tmp_path / 'pwned').exists()
