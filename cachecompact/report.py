"""`cachecompact.report`, kept for one release: the session report.

It moved to `cachecompact.tools.session_report`.
Importing this module warns once (DeprecationWarning) and re-exports the same objects, so code
written against 0.3 keeps working through 0.4. Import `cachecompact.tools.session_report` instead.
"""

from __future__ import annotations

import warnings

from .tools.session_report import *  # noqa: F403
from .tools.session_report import __all__ as __all__

warnings.warn("cachecompact.report moved to cachecompact.tools.session_report; the old path goes in 0.4",
              DeprecationWarning, stacklevel=2)
