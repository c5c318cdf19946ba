"""Small framework-free helpers shared by every part of the project."""

from . import util
from .util import EasyDict

__all__ = ['EasyDict', 'util']
