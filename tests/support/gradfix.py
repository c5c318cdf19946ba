"""A fixture of the tests of ops that record their autograd Functions for higher-order gradients."""

import pytest

from ops import conv2d_gradfix


@pytest.fixture(autouse=True)
def higher_order_gradients(monkeypatch):
    """Imported by a test module: every test there runs as inside conv2d_gradfix.higher_order_gradients(), where the
    ops record their autograd Functions; set through monkeypatch, so that a test switching it off again is undone in
    order."""
    monkeypatch.setattr(conv2d_gradfix, 'higher_order_active', True)
