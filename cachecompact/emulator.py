"""`cachecompact.emulator`, kept for one release: the local Messages API emulator.

It moved to `cachecompact.tools.emulator`.
Importing this module warns once (DeprecationWarning) and re-exports the same objects, so code
written against 0.3 keeps working through 0.4. Import `cachecompact.tools.emulator` instead.
"""

from __future__ import annotations

import warnings

from .tools.emulator import *  # noqa: F403
from .tools.emulator import __all__ as __all__

warnings.warn("cachecompact.emulator moved to cachecompact.tools.emulator; the old path goes in 0.4",
              DeprecationWarning, stacklevel=2)
