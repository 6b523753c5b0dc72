"""`cachecompact.tools.emulator.server`, kept for one release.

It moved to `cachecompact.tools.emulator._emulator_http`.

Importing the old path warns (DeprecationWarning) and gives the new module itself, so every
name, private ones and patches included, is the same object. Import `cachecompact.tools.emulator._emulator_http`.
"""

from __future__ import annotations

import sys
import warnings

from . import _emulator_http as _moved
from ._emulator_http import *  # noqa: F403

warnings.warn(f"{__name__} moved to {_moved.__name__}; the old path goes in 0.5", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
