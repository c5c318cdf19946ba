"""Settings shared by every test."""

import pytest
import torch


@pytest.fixture(autouse=True)
def single_thread():
    """The test networks are tiny: on a loaded 2-core CPU, intra-op threading costs far more than it saves."""
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(num_threads)
