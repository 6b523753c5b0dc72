"""`cachecompact.adapters.proxy.server`, kept for one release.

It moved to `cachecompact.adapters.proxy._proxy_app`.

Importing the old path warns (DeprecationWarning) and gives the new module itself, so every
name, private ones and patches included, is the same object. Import `cachecompact.adapters.proxy._proxy_app`.
"""

from __future__ import annotations

import sys
import warnings

from . import _proxy_app as _moved
from ._proxy_app import *  # noqa: F403

warnings.warn(f"{__name__} moved to {_moved.__name__}; the old path goes in 0.5", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
