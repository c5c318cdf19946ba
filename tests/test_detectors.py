"""Tests of metrics/detectors.py: grayscale input, full float32 precision in every detector call (on a CPU, where
torch's TF32 switches are plain flags, and on a GPU against float64), and the detector's failure message."""

import numpy as np
import pytest
import torch

from metrics import detectors, features
from tests.support.detector_spy import assert_full_precision
from torch_utils import devices


class _ChannelMeans(torch.nn.Module):
    def forward(self, x: torch.Tensor, return_features: bool = False) -> torch.Tensor:
        assert x.dtype == torch.uint8
        return x.to(torch.float32).mean(dim=[2, 3])


def test_run_detector_repeats_grayscale():
    detector = torch.jit.script(_ChannelMeans())
    gray = torch.tensor([[[[0, 10], [20, 30]]]], dtype=torch.uint8)
    out = detectors.run_detector(detector, gray, dict(return_features=True))
    np.testing.assert_array_equal(out.numpy(), [[15.0, 15.0, 15.0]])


def test_detector_runs_with_tf32_off_and_the_switches_come_back(tf32_on):
    seen = []

    def detector(x, return_features=False):
        seen.append(devices.read_switches())
        if x.shape[0] == 0:
            raise RuntimeError('detector failed')
        return x.to(torch.float32).mean(dim=[2, 3])

    before = devices.read_switches()
    images = torch.zeros([2, 3, 4, 4], dtype=torch.uint8)
    detectors.run_detector(detector, images, dict(return_features=True))
    assert devices.read_switches() == before and before['matmul_tf32'] and before['cudnn_tf32']
    with pytest.raises(RuntimeError, match='detector failed'):
        detectors.run_detector(detector, images[:0], dict(return_features=True))
    assert devices.read_switches() == before  # Also when the detector raises.
    assert_full_precision(seen, num_calls=2)
    assert all(s == dict(before, matmul_tf32=False, cudnn_tf32=False) for s in seen)  # Nothing else changed.


class _ConvFeatures(torch.nn.Module):
    """A convolutional detector with random weights: uint8 images -> 64 pooled features. Wide enough that TF32's
    10-bit mantissa shows (relative errors ~1e-3), where float32's 1e-5 does not."""

    def __init__(self):
        super().__init__()
        self.convs = torch.nn.ModuleList([torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.Conv2d(64, 128, 3, padding=1),
                                          torch.nn.Conv2d(128, 64, 3, padding=1)])
        self.fc = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor, return_features: bool = False) -> torch.Tensor:
        h = x.to(self.fc.weight.dtype) / 127.5 - 1
        for conv in self.convs:
            h = torch.relu(conv(h))
        return self.fc(h.mean(dim=[2, 3]))


@pytest.mark.gpu
def test_features_on_the_gpu_match_float64_even_with_tf32_allowed(tf32_on):
    """On CUDA, with TF32 allowed around it, a convolutional detector's features match a float64 CPU computation
    within 1e-5 relative (of the largest feature)."""
    torch.manual_seed(0)
    net = _ConvFeatures().eval()
    images = torch.randint(0, 256, [8, 3, 32, 32], dtype=torch.uint8)
    with torch.no_grad():
        reference = net.double()(images, return_features=True)
        detector = torch.jit.script(net.float().cuda())
        features = detectors.run_detector(detector, images.cuda(), dict(return_features=True)).double().cpu()
        error = ((features - reference).abs().max() / reference.abs().max()).item()
        assert error <= 1e-5, f'features differ from float64 by {error:.3g} of the largest'
        if torch.cuda.get_device_capability() >= (8, 0):  # TF32 tensor cores: the same call outside run_detector misses.
            tf32 = detector(images.cuda(), return_features=True).double().cpu()
            tf32_error = ((tf32 - reference).abs().max() / reference.abs().max()).item()
            assert tf32_error > 1e-5, f'with TF32 the features differ by only {tf32_error:.3g}: the test cannot tell'


def test_unreachable_detector_gives_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv('GNGAN_CACHE_DIR', str(tmp_path))
    url = 'http://127.0.0.1:9/x.pt'
    with pytest.raises(detectors.DetectorUnavailableError) as info:
        detectors.get_feature_detector(url)
    message = str(info.value)
    assert '\n' not in message and url in message and '--detector=/path/to/x.pt' in message


def test_missing_or_broken_detector_file(tmp_path):
    with pytest.raises(detectors.DetectorUnavailableError, match='missing.pt'):
        detectors.get_feature_detector(str(tmp_path / 'missing.pt'))
    bogus = tmp_path / 'bogus.pt'
    bogus.write_bytes(b'not a TorchScript archive')
    with pytest.raises(detectors.DetectorUnavailableError, match='--detector=PATH_OR_URL'):
        detectors.get_feature_detector(str(bogus))


def test_vgg16_detector_message_names_its_own_option(tmp_path, monkeypatch):
    monkeypatch.setenv('GNGAN_CACHE_DIR', str(tmp_path))
    url = 'http://127.0.0.1:9/vgg16.pt'
    opts = features.MetricOptions(detector_url='http://127.0.0.1:9/inception.pt', pr_detector_url=url)
    assert opts.detector_option(url) == '--pr-detector' and opts.detector_option(opts.detector_url) == '--detector'
    assert features.MetricOptions().detector_option(detectors.VGG16_URL) == '--pr-detector'
    with pytest.raises(detectors.DetectorUnavailableError) as info:
        detectors.get_feature_detector(url, option=opts.detector_option(url))
    assert '--pr-detector=/path/to/vgg16.pt' in str(info.value) and '--detector=' not in str(info.value)
