"""`cachecompact.strategies`, kept for one release: the strategy catalog.

It moved to `cachecompact.compaction.catalog`.
Importing this module warns once (DeprecationWarning) and re-exports the same objects, so code
written against 0.3 keeps working through 0.4. Import `cachecompact.compaction.catalog` instead.
"""

from __future__ import annotations

import warnings

from .compaction.catalog import *  # noqa: F403
from .compaction.catalog import __all__ as _catalog_names, register
from .compaction.peers import *  # noqa: F403  (the peers' config classes were read from here too)
from .compaction.peers import __all__ as _peer_names

__all__ = [*_catalog_names, *_peer_names, "register"]

warnings.warn("cachecompact.strategies moved to cachecompact.compaction.catalog; the old path goes in 0.4",
              DeprecationWarning, stacklevel=2)
