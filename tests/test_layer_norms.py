"""metrics/layer_norms.py: per-layer operator norms by power iteration against a dense SVD of the layer's matrix."""

import numpy as np
import pytest
import torch
from torch import nn

from metrics import layer_norms
from tests.support.references import dense_norm
from training.networks import sngan, stylegan


def with_random_bias(layer: nn.Module) -> nn.Module:
    with torch.no_grad():
        layer.bias.normal_()
    return layer


@pytest.mark.parametrize('make, shape', [
    (lambda: nn.Conv2d(3, 5, 4, stride=2, padding=1), (3, 6, 6)),
    (lambda: nn.Conv2d(2, 4, 3, padding=1), (2, 5, 5)),
    (lambda: sngan.Conv2d(2, 3, 3, padding=1), (2, 4, 7)),
    (lambda: nn.ConvTranspose2d(3, 2, 4, stride=2, padding=1), (3, 3, 3)),
    (lambda: nn.Linear(20, 7), (20,)),
])
def test_power_iteration_matches_a_dense_svd(make, shape):
    torch.manual_seed(0)
    layer = with_random_bias(make())
    norm, iterations = layer_norms.operator_norm(layer, shape, tol=1e-10, max_iter=5000)
    assert norm == pytest.approx(dense_norm(layer, shape), rel=1e-6)
    assert iterations > 1


def test_a_convolution_is_not_its_reshaped_weight():
    """A 3x3 conv on a 5x5 input with all-positive weights: its operator norm is more than twice the reshaped sigma."""
    torch.manual_seed(0)
    layer = nn.Conv2d(1, 1, 3, padding=1)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.0)
    norm, _ = layer_norms.operator_norm(layer, (1, 5, 5))
    sigma = float(np.linalg.norm(layer.weight.detach().double().numpy().reshape(1, -1), ord=2))
    assert norm == pytest.approx(dense_norm(layer, (1, 5, 5)), rel=1e-5)
    assert norm > 2 * sigma


def test_every_layer_of_a_spectrally_normalized_cnn_discriminator():
    """The standard CNN D at 8x8 with SN: each layer's norm as applied (its input size recorded from the forward pass)
    matches the dense SVD; sigma(W) is numpy's of the normalized weight, sigma raw that of the raw weight."""
    torch.manual_seed(1)
    D = sngan.CNNDiscriminator(c_dim=0, img_resolution=8, img_channels=1, ch=2, spectral_norm=True)
    for _ in range(3):
        D(torch.randn([2, 1, 8, 8]), torch.zeros([2, 0]))  # Training-mode calls: SN's power iteration advances.
    norms = layer_norms.layer_norms(D, tol=1e-10, max_iter=5000)
    expected_shapes = [(1, 8, 8), (2, 8, 8), (4, 4, 4), (4, 4, 4), (8, 2, 2), (8, 2, 2), (16, 1, 1), (16,)]
    assert [n.input_shape for n in norms] == expected_shapes
    assert [n.name for n in norms] == [f'convs.{i}' for i in range(7)] + ['fc']
    D.eval()
    for n, shape in zip(norms, expected_shapes):
        layer = D.get_submodule(n.name)
        assert n.operator_norm == pytest.approx(dense_norm(layer, shape), rel=1e-6)
        with torch.no_grad():
            used = layer.weight.double().numpy()
        raw = layer.parametrizations.weight.original.detach().double().numpy()
        assert n.sigma_reshaped == pytest.approx(np.linalg.norm(used.reshape(used.shape[0], -1), ord=2), rel=1e-6)
        assert n.sigma_raw == pytest.approx(np.linalg.norm(raw.reshape(raw.shape[0], -1), ord=2), rel=1e-9)


def test_stylegan_layers_are_measured_without_their_activation():
    """An equalized-lr conv with a fused LeakyReLU and 2x down-sampling (blur, conv, 2x2 average): its norm is that of
    the same layer built linear."""
    torch.manual_seed(0)
    act = stylegan.Conv2dLayer(in_channels=2, out_channels=3, kernel_size=3, activation='lrelu', down=2)
    linear = stylegan.Conv2dLayer(in_channels=2, out_channels=3, kernel_size=3, activation='linear', down=2)
    linear.load_state_dict(act.state_dict())
    with torch.no_grad():
        act.bias.normal_()
    assert layer_norms.is_weight_layer(act)
    norm, _ = layer_norms.operator_norm(act, (2, 6, 6), tol=1e-10, max_iter=5000)
    assert norm == pytest.approx(dense_norm(linear, (2, 6, 6)), rel=1e-6)


def test_command_prints_each_layer_and_draws_panel_c(tmp_path):
    from click.testing import CliRunner

    from bench import layer_norms as command
    from torch_utils import persistence
    paths = []
    for norm in ('sn', 'gn'):
        torch.manual_seed(2)
        D = sngan.CNNDiscriminator(c_dim=0, img_resolution=8, img_channels=1, ch=2, spectral_norm=(norm == 'sn'))
        paths.append(str(tmp_path / f'{norm}.pkl'))
        persistence.save_snapshot(paths[-1], dict(D=D))
    out = tmp_path / 'panel.png'
    result = CliRunner().invoke(command.main, [f'--network={paths[0]}', '--label=SN', f'--network={paths[1]}',
                                               '--label=GN', f'--out={out}'])
    assert result.exit_code == 0, result.output
    assert out.stat().st_size > 0
    fc_line = [line for line in result.output.splitlines() if line.split()[1:2] == ['fc']][1]  # GN's fc layer.
    weight = D.fc.weight.detach().double().numpy()
    assert float(fc_line.split()[4]) == pytest.approx(np.linalg.norm(weight, ord=2), rel=1e-3)  # A linear layer: sigma(W).
    result = CliRunner().invoke(command.main, [f'--network={paths[0]}', f'--out={out}'])
    assert result.exit_code != 0 and 'Traceback' not in result.output and '--out' in result.output


def test_a_projection_discriminators_label_embedding_is_not_a_layer_of_the_image_path():
    torch.manual_seed(0)
    D = sngan.CNNDiscriminator(c_dim=10, img_resolution=8, img_channels=1, ch=2, depth=3)
    assert [n.name for n in layer_norms.layer_norms(D)] == ['convs.0', 'convs.1', 'convs.2', 'fc']


def test_sigma_reshaped_of_a_stylegan_layer_carries_its_equalized_lr_gain():
    """StyleGAN v1's layers store w and use w * sqrt(2) / sqrt(fan_in) (He gain, equalized learning rate):
    sigma_reshaped is that of the used weight, numpy's SVD of w * sqrt(2 / (in * k * k)) reshaped to [out, -1]."""

    class OneLayerD(nn.Module):
        img_channels, img_resolution = 4, 6

        def __init__(self):
            super().__init__()
            self.conv = stylegan.Conv2dLayer(in_channels=4, out_channels=3, kernel_size=3, activation='linear')

        def forward(self, img, c):
            return self.conv(img).sum(dim=[1, 2, 3])[:, None]

    torch.manual_seed(0)
    D = OneLayerD()
    weight = D.conv.weight.detach().double().numpy()
    expected = np.linalg.svd(weight.reshape(3, -1) * np.sqrt(2 / (4 * 3 * 3)), compute_uv=False)[0]
    norms = layer_norms.layer_norms(D)
    assert [n.name for n in norms] == ['conv']
    assert norms[0].sigma_reshaped == pytest.approx(expected, rel=1e-9)
