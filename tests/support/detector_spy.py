"""A spy on the detectors of metrics/detectors.py: torch's process-wide switches at each of their calls, shared by the
tests of the detectors and of the entry points (calc_metric, calc_metrics.py, the evaluation inside a training run);
the fixture tf32_on of tests/conftest.py sets the switches it must not see."""

from __future__ import annotations

from metrics import detectors
from torch_utils import devices


def spy_on_detectors(monkeypatch) -> list[dict]:
    """Every detector loaded through metrics/detectors.py from now on records torch's process-wide switches
    (devices.read_switches) at each of its calls, in the list returned."""
    seen = []
    load = detectors.get_feature_detector

    def load_spying(*args, **kwargs):
        detector = load(*args, **kwargs)

        def call(*call_args, **call_kwargs):
            seen.append(devices.read_switches())
            return detector(*call_args, **call_kwargs)
        return call
    monkeypatch.setattr(detectors, 'get_feature_detector', load_spying)
    return seen


def assert_full_precision(seen: list[dict], num_calls: int | None = None) -> None:
    """Every recorded call ran with TF32 off (and there were `num_calls`, or at least one)."""
    assert len(seen) == num_calls if num_calls is not None else seen
    assert all(not s['matmul_tf32'] and not s['cudnn_tf32'] for s in seen), seen
