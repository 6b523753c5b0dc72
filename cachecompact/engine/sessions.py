"""The 0.3 home of `engine.identity` (the rule) and `engine.registry` (the live sessions), kept
for one release: importing it warns."""

from __future__ import annotations

import warnings

from ..base.pricing import model_window
from ._registry import Live, LiveMaker, Resolved, SessionRegistry, SummarizerFactory
from .identity import (
    Candidate,
    Decision,
    RequestHistory,
    decide,
    family_key,
    family_order,
    in_family,
    new_id,
    preamble_key as head_key,
    session_hint,
)

__all__ = ["Candidate", "Decision", "Live", "LiveMaker", "RequestHistory", "Resolved", "SessionRegistry",
           "SummarizerFactory", "decide", "family_key", "family_order", "head_key", "in_family", "model_window",
           "new_id", "session_hint"]

warnings.warn("cachecompact.engine.sessions moved to cachecompact.engine.identity (the rule; the live sessions "
              "are the engine's own now); the old path goes in 0.4", DeprecationWarning, stacklevel=2)
