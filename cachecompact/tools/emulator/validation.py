"""Request validation as the Messages API does it: moved to `cachecompact.cache.request_validation`
(issue 56), so that opening a session (history/) runs the check `ledger verify` runs; re-exported
here for the emulator and for code written against this path."""

from ...cache.request_validation import (
    MessageInfo,
    check_message,
    check_pairing,
    check_request,
    count_breakpoints,
    validate_messages,
    validate_request,
)

__all__ = ["MessageInfo", "check_message", "check_pairing", "check_request", "count_breakpoints",
           "validate_messages", "validate_request"]
