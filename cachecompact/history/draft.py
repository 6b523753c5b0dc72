"""Draft: one session as a strategy sees it while it plans (issue 49, "draft in, plan out").

A strategy is built with a `Draft`, never with the `Session`: it can read what it needs to plan
(the transcript, the ledger, renders, token counts, where the immutable prefix ends) and propose
what it decided (ledger edits with `stage`, scratchpad content with `keep`), and nothing else.
There is no store here, no ``edit``, no ``commit``, no way to append to the transcript or to
record a request: the request cycle commits what a strategy staged, blobs and ledger entries
together (`Session.commit`), after the strategy returns its `Plan`.

The transcript and the ledger are handed out as read-only views (typed as their reading
protocols, `TranscriptReader` and `LedgerReader`): nothing that appends is reachable through
them, and the lists they return are copies.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..base.tokens import TokenCounter
from .ledger import Edit, Ledger, LedgerEntry, LedgerReader
from .transcript import Transcript, TranscriptReader

if TYPE_CHECKING:
    from ..base.wire import Message
    from .render import RenderedMessage, RenderResult
    from .session import Session

__all__ = ["Draft"]


_PROPOSE = "propose with draft.stage(edit, level=...) and draft.keep(text), and return them in the Plan"
_WRITES = {
    "edit": _PROPOSE,
    "commit": "the request cycle stores what the plan staged, after the strategy returns",
    "store": "a strategy never reaches the store; " + _PROPOSE,
    "append": "the transcript is the agent's history, appended by the request cycle",
    "sync": "the transcript is the agent's history, synced by the request cycle",
    "record_request": "the request cycle records each request",
    "put_blob": "keep scratchpad content with draft.keep(text), stored with the plan",
}


class _TranscriptView:
    """The session's transcript, to read only: no method that appends is reachable through it."""

    __slots__ = ("_t",)

    def __init__(self, t: Transcript) -> None:
        self._t = t

    def __len__(self) -> int:
        return len(self._t)

    def __getitem__(self, i: int) -> Message:
        return self._t[i]  # the transcript's own message, not copied (each request reads many): read it only

    def hash_of(self, i: int) -> bytes:
        return self._t.hash_of(i)

    @property
    def identities(self) -> list[bytes]:
        return list(self._t.identities)  # a copy: the transcript's own list is not handed out

    def has_tool_use(self, i: int) -> bool:
        return self._t.has_tool_use(i)

    def is_tool_result_message(self, i: int) -> bool:
        return self._t.is_tool_result_message(i)


class _LedgerView:
    """The session's ledger, to read only: its entries as a tuple, the edits in force."""

    __slots__ = ("_entries", "_l")

    def __init__(self, ledger: Ledger) -> None:
        self._l = ledger
        self._entries: tuple[LedgerEntry, ...] = ()

    @property
    def entries(self) -> tuple[LedgerEntry, ...]:
        """A tuple, made again only when the ledger has changed: levels read it inside loops over
        messages, and a copy per read made building a view quadratic in the ledger's length."""
        live, held = self._l.entries, self._entries
        if len(held) != len(live) or (held and held[-1] is not live[-1]):
            self._entries = held = tuple(live)
        return held

    def __len__(self) -> int:
        return len(self._l)

    def effective(self, upto: int | None = None) -> list[LedgerEntry]:
        return self._l.effective(upto)  # a new list each call

    def compaction_end(self, upto: int | None = None) -> int | None:
        return self._l.compaction_end(upto)


class Draft:
    """A session, read-only, plus the edits and scratchpad content a strategy proposes for it.

    `stage` and `keep` change what renders and counts see at once (in memory), so a strategy can
    weigh one edit after another; the request cycle stores them together after the strategy
    returns (`Session.commit`), or a strategy driven by hand has them stored before the session
    next writes. ``stable_before`` is the one planning hint a strategy sets: the transcript
    messages before it will not be edited next, so the breakpoint planner marks their end.
    """

    __slots__ = ("_ledger", "_session", "_transcript")

    def __init__(self, session: Session) -> None:
        self._session = session
        self._transcript = _TranscriptView(session.transcript)
        self._ledger = _LedgerView(session.ledger)

    if not TYPE_CHECKING:  # hidden from type checkers, which refuse these names outright

        def __getattr__(self, name: str) -> Any:
            """A write a strategy reaches for (``edit``, ``commit``, ``store``, ...) is named with
            its replacement; a draft has none of them."""
            if name in _WRITES:
                raise AttributeError(f"Draft.{name}: a strategy does not write; {_WRITES[name]}")
            raise AttributeError(f"'Draft' object has no attribute {name!r}")

    def __repr__(self) -> str:
        return f"Draft({self._session.session_id!r}, {len(self._session)} messages)"

    # -- reading -------------------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        """The session's id (what events name)."""
        return self._session.session_id

    @property
    def prefix_messages(self) -> int:
        """How many first messages the immutable prefix holds (the session's setting)."""
        return self._session.prefix_messages

    @property
    def path(self) -> Path | None:
        """The session directory of a file-backed session (what a message tells the user to
        open), else None."""
        return self._session.path

    @property
    def transcript(self) -> TranscriptReader:
        """Every message so far, as sent: ``len``, ``[i]`` (a `base.wire.Message`, whose content
        blocks are msgspec Structs such as `base.wire.ToolResultBlock`: test them with
        ``isinstance``), ``hash_of``, ``has_tool_use``, ``is_tool_result_message``."""
        return self._transcript

    @property
    def ledger(self) -> LedgerReader:
        """The edits so far, staged ones included: ``entries``, ``effective()`` (those in force)."""
        return self._ledger

    @property
    def counter(self) -> TokenCounter:
        """The session's token counter; a strategy calibrates it from the counts the API reports."""
        return self._session.counter

    @property
    def prefix_end(self) -> int | None:
        """The first message an edit may start at; None while the immutable prefix is still
        forming (the first requests of a session): plan nothing then."""
        return self._session.prefix_end

    @property
    def edit_floor(self) -> int | None:
        """`prefix_end`, or after what an API-written summary stands for (its block opens the
        request); None while the prefix forms."""
        return self._session.edit_floor

    def __len__(self) -> int:
        return len(self._session)

    def render(self, model: str | None = None, max_tokens: int | None = None, **kw: Any) -> RenderResult:
        """`Session.render`, staged edits included."""
        if model is not None:
            kw["model"] = model
        if max_tokens is not None:
            kw["max_tokens"] = max_tokens
        return self._session.render(**kw)

    def plain_message(self, i: int) -> RenderedMessage:
        """Transcript message ``i`` rendered as sent, before any edit (its blocks carry token counts)."""
        return self._session.renderer.plain_message(i)

    def edit_effect(self, edit: Edit) -> tuple[int, int]:
        """Estimated tokens ``edit``'s range occupies now and would after it (nothing is staged)."""
        return self._session.edit_effect(edit)

    # -- proposing -----------------------------------------------------------------------------

    def stage(self, edit: Edit, *, level: str = "manual", created_at: str | None = None) -> LedgerEntry:
        """Propose one ledger edit: validated and counted now (`Session.stage`; a typed
        `InvalidEditError` stages nothing), stored with the plan."""
        return self._session.stage(edit, level=level, created_at=created_at)

    @property
    def staged(self) -> list[LedgerEntry]:
        """The edits proposed and not yet stored, in order."""
        return self._session.staged

    def keep(self, text: str) -> str:
        """Keep ``text`` in the session's scratchpad with the plan; its reference (``sp_...``),
        which a placeholder may name at once."""
        return self._session.stage_blob(text.encode("utf-8"))

    @property
    def stable_before(self) -> int | None:
        """Transcript messages before this will not be edited next (a hint the breakpoint
        planner uses: it marks their end); None: no hint."""
        return self._session.stable_before

    @stable_before.setter
    def stable_before(self, value: int | None) -> None:
        self._session.stable_before = value
