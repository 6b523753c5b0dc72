"""The ``anthropic-version`` a request names, and what API version 2026-10-21 refuses.

The docs (api/migration-2026-10-21): "These changes apply to requests to the Messages API (POST
/v1/messages), to token counting, and to each request in a Message Batch created with
2026-10-21." The Python SDK 2.x, the TypeScript SDK 1.x and the Go SDK 2.x send it by default
(the installed anthropic 2.16's ``_constants.ANTHROPIC_API_VERSION``). Under it:

* ``temperature``, ``top_p`` and ``top_k`` are 400s on every model, even at their defaults
  ("temperature: Extra inputs are not permitted", as third-party write-ups quote the error);
* a ``document`` block directly in an ``assistant`` message is a 400 (the page's heading: "Document
  blocks in assistant messages return an error");
* a user ``text`` block with non-empty ``citations`` is a 400.

The exact texts of the last two are not in the part of the page we can read: the emulator's name
the place and the rule. ``2023-06-01`` keeps the old behaviour; a request without the header is
a 400, as the API answers (every SDK sends it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ...base.errors import MalformedMessageError

__all__ = ["NEW", "OLD", "VERSIONS", "check_version", "version_of"]

OLD = "2023-06-01"
NEW = "2026-10-21"
VERSIONS = (OLD, NEW)
SAMPLING = ("temperature", "top_p", "top_k")


def version_of(headers: Mapping[str, str]) -> str:
    """The request's API version. Without the header, or with one the API does not know, a 400 as
    the API answers (api/versioning: "When making API requests, you must send an anthropic-version
    request header"; the API's messages, as clients have reported them: "anthropic-version: header
    is required", and "anthropic-version: "X" is not a valid version")."""
    v = headers.get("anthropic-version")
    if v is None:
        raise MalformedMessageError("anthropic-version", "header is required")
    v = str(v).strip()
    if v not in VERSIONS:
        raise MalformedMessageError("anthropic-version", f"{json.dumps(v[:40])} is not a valid version")
    return v


def check_version(body: Mapping[str, Any], version: str) -> None:
    """What ``version`` refuses that the older one accepts."""
    if version != NEW:
        return
    for k in SAMPLING:
        if k in body:
            raise MalformedMessageError(k, "Extra inputs are not permitted (API version 2026-10-21 removed the "
                                           "sampling parameters)")
    for i, m in enumerate(body.get("messages") or []):
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            continue
        for j, b in enumerate(content):
            if not isinstance(b, dict):
                continue
            if m.get("role") == "assistant" and b.get("type") == "document":
                raise MalformedMessageError(f"messages.{i}.content.{j}", "document blocks are not permitted in "
                                                                         "assistant messages (API version 2026-10-21)")
            if m.get("role") == "user" and b.get("type") == "text" and b.get("citations"):
                raise MalformedMessageError(f"messages.{i}.content.{j}.citations",
                                            "citations are not permitted on user text blocks (API version "
                                            "2026-10-21)")
