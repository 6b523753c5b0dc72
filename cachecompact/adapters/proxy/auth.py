"""`cachecompact.adapters.proxy.auth`, kept for one release.

It became private (`_auth.py`): only its own folder uses it, and the folder hands on its
public names. Importing the old path warns (DeprecationWarning) and gives the private
module itself.
"""

from __future__ import annotations

import sys
import warnings

from . import _auth as _moved
from ._auth import *  # noqa: F403

warnings.warn(f"{__name__} moved to {_moved.__name__} (private); the old path goes in 0.5", DeprecationWarning,
              stacklevel=2)
sys.modules[__name__] = _moved
