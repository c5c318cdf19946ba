"""Tests of metrics/detectors.py: grayscale input, and the detector's failure message."""

import numpy as np
import pytest
import torch

from metrics import detectors, features


class _ChannelMeans(torch.nn.Module):
    def forward(self, x: torch.Tensor, return_features: bool = False) -> torch.Tensor:
        assert x.dtype == torch.uint8
        return x.to(torch.float32).mean(dim=[2, 3])


def test_run_detector_repeats_grayscale():
    detector = torch.jit.script(_ChannelMeans())
    gray = torch.tensor([[[[0, 10], [20, 30]]]], dtype=torch.uint8)
    out = detectors.run_detector(detector, gray, dict(return_features=True))
    np.testing.assert_array_equal(out.numpy(), [[15.0, 15.0, 15.0]])


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
