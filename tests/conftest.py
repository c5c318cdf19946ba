"""Settings shared by every test.

The suite passes on a CPU machine and on a GPU machine alike. Tests that check CPU behaviour are pinned
to the CPU: in this process (the tools' default device is the CPU) and in the subprocesses they start
(CUDA_VISIBLE_DEVICES is empty). Tests marked `gpu` see the GPUs, and are skipped without one. Every test
must leave the process-wide switches (torch's TF32, cuDNN and determinism; which autograd Functions the
ops of ops/conv2d_gradfix.py record) as it found them.

The host build of the kernels' arithmetic (tests/support/host_plugin.py, built once per machine and shared by
every process of the suite) and the CPU route through the ops' kernel path are fixtures here, shared by
tests/test_custom_ops.py and tests/test_kernel_choice.py. A test that hangs is ended by tests/support/watchdog.py.
"""

import ctypes

import pytest
import torch

from ops import bias_act, conv2d_gradfix, upfirdn2d
from tests.support import host_plugin, tiny_runs, watchdog
from torch_utils import devices, kernel_choice

# Read once, before any test hides the GPUs: CUDA is initialized here so that torch's device count no longer
# follows CUDA_VISIBLE_DEVICES, which the fixture below empties for the subprocesses of CPU tests.
CUDA_AVAILABLE = torch.cuda.is_available()
if CUDA_AVAILABLE:
    torch.cuda.init()


def pytest_configure(config):
    config.pluginmanager.register(watchdog.Watchdog.from_environment(), 'gngan-watchdog')


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason='needs a CUDA GPU')
    for item in items:
        if item.get_closest_marker('gpu') is not None and not CUDA_AVAILABLE:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def pinned_device(request, monkeypatch):
    """A test not marked `gpu` runs on the CPU, and so does every process it starts."""
    if request.node.get_closest_marker('gpu') is None:
        monkeypatch.setattr(devices, 'default_device', lambda: torch.device('cpu'))
        monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '')


def _switches() -> dict:
    """torch's process-wide switches (torch_utils/devices.py) and the ops' own (which autograd Functions they record)."""
    return dict(devices.read_switches(), gradfix_enabled=conv2d_gradfix.enabled,
                gradfix_higher_order=conv2d_gradfix.higher_order_active,
                gradfix_no_weight_gradients=conv2d_gradfix.weight_gradients_disabled)


def _write_switches(switches: dict) -> None:
    devices.write_switches({name: value for name, value in switches.items() if not name.startswith('gradfix_')})
    conv2d_gradfix.enabled = switches['gradfix_enabled']
    conv2d_gradfix.higher_order_active = switches['gradfix_higher_order']
    conv2d_gradfix.weight_gradients_disabled = switches['gradfix_no_weight_gradients']


@pytest.fixture
def switches():
    """Set torch's process-wide switches for one test by their names in devices.read_switches
    (`switches(matmul_tf32=True)`); restored after the test. Not monkeypatch.setattr: cuBLAS's switches are no
    attributes of their object, and pytest 9.2's monkeypatch deletes such an attribute on undo."""
    before = devices.read_switches()
    yield lambda **changes: devices.write_switches(dict(devices.read_switches(), **changes))
    devices.write_switches(before)


@pytest.fixture(autouse=True)
def backend_switches_kept():
    """Fail a test after which the process-wide switches differ from before it (and restore them)."""
    before = _switches()
    yield
    after = _switches()
    if after != before:
        _write_switches(before)
        changed = {name: (before[name], after[name]) for name in before if before[name] != after[name]}
        pytest.fail(f'process-wide switches left changed (before, after): {changed}')


@pytest.fixture(autouse=True)
def single_thread():
    """The test networks are tiny: on a loaded 2-core CPU, intra-op threading costs far more than it saves."""
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(num_threads)


@pytest.fixture(scope='session')
def host_kernels():
    """ctypes handle to the host build of both kernels' arithmetic (built once per machine, see host_plugin)."""
    if host_plugin.NVCC is None:
        pytest.skip('nvcc is not on the PATH')
    return ctypes.CDLL(host_plugin.cached_library())


@pytest.fixture
def cpu_kernel_path(monkeypatch):
    """install(plugin): CPU tensors take the ops' kernel path (layout handling, self-check) served by plugin."""
    def install(plugin):
        for op in (bias_act, upfirdn2d):
            monkeypatch.setattr(op._plugin, 'device_type', 'cpu')
            monkeypatch.setattr(op._plugin, 'module', plugin)
            monkeypatch.setattr(op._plugin, 'failed', False)
            monkeypatch.setattr(op._plugin, 'verdicts', {})
            monkeypatch.setattr(op._plugin, 'check_results', {})
            monkeypatch.setattr(op._plugin, 'choices', {})
            monkeypatch.setattr(op._plugin, 'plans', {})
        return plugin
    monkeypatch.delenv(kernel_choice.SELF_CHECK_ENV, raising=False)
    monkeypatch.setenv(kernel_choice.AUTOTUNE_ENV, '0')  # the host build is no GPU: timing it would say nothing
    return install


@pytest.fixture
def tiny_preset(monkeypatch):
    """--cfg=tiny, the quick start's networks at width 2 for images of any resolution (tests/support/tiny_runs.py)."""
    tiny_runs.add_tiny_preset(monkeypatch)


@pytest.fixture
def tf32_on(switches):
    """TF32 allowed for matmuls and convolutions, as PyTorch's default (convolutions) or --precision=tf32 sets it."""
    switches(matmul_tf32=True, cudnn_tf32=True)
