"""`cachecompact.tools.traces.claude_code`, kept for one release.

It moved to `cachecompact.tools.traces.claude_code_logs`.

Importing the old path warns (DeprecationWarning) and gives the new module itself, so every
name, private ones and patches included, is the same object. Import `cachecompact.tools.traces.claude_code_logs`.
"""

from __future__ import annotations

import sys
import warnings

from . import claude_code_logs as _moved
from .claude_code_logs import *  # noqa: F403

warnings.warn(f"{__name__} moved to {_moved.__name__}; the old path goes in 0.5", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
