"""What the proxy knows of its clients by their User-Agent (`adapters.proxy._clients`)."""

from __future__ import annotations

import pytest

from cachecompact.adapters.proxy._clients import lowers_reserve


@pytest.mark.parametrize(("ua", "known"), [
    ("claude-cli/2.1.337 (external, cli)", True),  # Claude Code retries the API's max_tokens 400 lowered
    ("Claude-CLI/3.0.0", True),
    ("opencode/1.18.33 ai-sdk/provider-utils/3.0.0", None),  # it does not lower: not known, learnt per session
    ("Anthropic/Python 0.75.0", None),
    ("", None),
    (None, None),
    ("my-claude-cli/1.0", None),  # a prefix, not a substring
])
def test_only_a_client_shown_to_lower_max_tokens_is_known_to(ua: str | None, known: bool | None) -> None:
    assert lowers_reserve(ua) is known
