"""Which stored history a request continues: the one rule, for `wrap()`, compact mode and observe mode.

A request is compared with stored histories by the identity of **every** message
(`transcript.message_hash`: forms the API treats as one message have one identity), never by a
sample. The rule, `decide`, is a pure function of the request and the candidate histories of
its *family* (the sessions under the request's name, or, unnamed, the sessions whose first
message is the request's first message):

1. **continue** the longest candidate whose whole history the request extends, when its tools
   and system prompt (the *head*) are the caller's (at equal length the same head wins);
2. **segment** when that candidate's head differs: the same conversation with a changed system
   prompt or tool list (reported as prefix churn). The immutable prefix never changes, so the
   new head needs a new session; it is linked to the one it continues;
3. **segment** when no candidate is extended but one has the same head: a rewrite of history
   (an agent redacted an old result; Claude Code compacted and now opens with its summary). It
   is linked to the candidate sharing the longest common prefix;
4. otherwise a new session: for a named request whose family holds only other heads, another
   agent under the same name (Claude Code's sub-agents share its session id), linked to the
   name's first session; for an unnamed one, simply a new conversation.

Whichever it is, the request that goes out is rendered from a history equal, message by
message, to what the caller sent. The adapters keep the candidates (live sessions, or the
proxy's observed ones) and act on the decision; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import msgspec
import xxhash

from ..base.wire import canonical_bytes, plain
from ..history.transcript import identity_of_bytes, message_hash

__all__ = ["Candidate", "Decision", "RequestHistory", "decide", "family_key", "head_key", "in_family", "new_id"]

Kind = Literal["continue", "segment", "agent", "new"]


def _unmarked_blocks(value: Any) -> Any:
    """A system prompt or tool list without ``cache_control`` markers, a string system prompt as
    one text block (the forms the API caches as the same prefix)."""
    if isinstance(value, str):
        return [{"type": "text", "text": value}] if value else value
    if isinstance(value, list):
        return [{k: v for k, v in x.items() if k != "cache_control"} if isinstance(x, dict) else x for x in value]
    return value


def head_key(tools: Any, system: Any) -> bytes:
    """Identity of a request's tools and system prompt (markers and string form ignored)."""
    tools = [plain(t) for t in tools] if isinstance(tools, list) else tools
    system = [plain(b) for b in system] if isinstance(system, list) else system
    return xxhash.xxh3_128_digest(canonical_bytes([_unmarked_blocks(tools or None), _unmarked_blocks(system)]))


def family_key(first: bytes) -> str:
    """The family of unnamed sessions that open with the message of identity ``first``:
    ``s_`` + 24 hex digits. Tools and system are not in it, so a changed system prompt is still
    found as the same conversation."""
    return "s_" + first.hex()[:24]


@dataclass(frozen=True, slots=True)
class RequestHistory:
    """A request's head and the identity of each of its messages, computed once per request."""

    head: bytes
    ids: list[bytes]

    @classmethod
    def of(cls, body: dict[str, Any]) -> RequestHistory:
        msgs = body.get("messages")
        ids = [message_hash(m) for m in msgs] if isinstance(msgs, list) else []
        return cls(head_key(body.get("tools"), body.get("system")), ids)

    @classmethod
    def of_bytes(cls, raw: bytes, body: dict[str, Any]) -> RequestHistory:
        """`of`, for a body that arrived as JSON ``raw`` (the proxy): each message's identity is
        looked up by the hash of the client's own bytes for it, and computed only for bytes not
        seen before."""
        try:
            spans = msgspec.json.decode(raw, type=_Messages).messages
        except (msgspec.DecodeError, msgspec.ValidationError):
            return cls.of(body)
        msgs = body.get("messages")
        if not isinstance(msgs, list) or len(msgs) != len(spans):
            return cls.of(body)
        return cls(head_key(body.get("tools"), body.get("system")),
                   [identity_of_bytes(s, m) for s, m in zip(spans, msgs, strict=True)])

    def fingerprint(self, *extra: Any) -> bytes:
        """xxh3-128 over the whole history (and ``extra``): equal exactly when the requests are."""
        h = xxhash.xxh3_128()
        h.update(self.head)
        h.update(b"".join(self.ids))  # one C call, not one per message
        h.update(canonical_bytes(list(extra)))
        return h.digest()


class _Messages(msgspec.Struct):
    """A request body's messages as the client's own bytes, one span each."""

    messages: list[msgspec.Raw]


class Candidate(Protocol):
    """A stored history the request may continue."""

    @property
    def sid(self) -> str: ...

    @property
    def head(self) -> bytes: ...

    @property
    def identities(self) -> Sequence[bytes]: ...


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with a request: ``continue`` ``target``, or start a new session (``segment``,
    ``agent`` or ``new``) linked to ``target`` (None: linked to nothing). ``reason`` says why in
    words for events and the dashboard; ``at`` is the first message that differs from
    ``target`` (a rewrite), or its length."""

    kind: Kind
    target: str | None
    reason: str
    at: int = 0


def _extends(req: list[bytes], ids: Sequence[bytes]) -> bool:
    """Whether ``req`` starts with all of ``ids`` (the last one first: the cheap refusal)."""
    n = len(ids)
    if n > len(req) or (n and req[n - 1] != ids[n - 1]):
        return False
    return req[:n] == (ids if isinstance(ids, list) else list(ids))


def _common(req: list[bytes], ids: Sequence[bytes]) -> int:
    """Length of the common prefix of two histories."""
    n = min(len(req), len(ids))
    if _extends(req, ids[:n]):
        return n
    return next(i for i in range(n) if req[i] != ids[i])


def decide(req: RequestHistory, candidates: Iterable[Candidate], *, named: bool, fixed_head: bool = True) -> Decision:
    """The one rule (module docstring). ``candidates`` come in family order (the first session
    of the family first, the newest last, which breaks the remaining ties). ``fixed_head`` says
    whether a session's tools and system are fixed (a session with an immutable prefix); where
    they are not (the proxy's observe mode records requests and holds no prefix), a changed
    head continues the conversation and is reported there."""
    cands = list(candidates)
    best: Candidate | None = None
    for c in cands:
        ids = c.identities
        if not _extends(req.ids, ids) or (not ids and c.head != req.head):
            continue
        if best is None or len(ids) > len(best.identities) or \
                (len(ids) == len(best.identities) and (c.head == req.head or best.head != req.head)):
            best = c
    if best is not None:
        n = len(best.identities)
        if best.head == req.head or not fixed_head:
            return Decision("continue", best.sid, "extends", n)
        if n >= 2:  # a conversation under way: its tools or system prompt changed
            return Decision("segment", best.sid, "prefix_churn", n)
        # one message in common is only a shared opening: another agent, not this conversation
    same = [c for c in cands if c.head == req.head and c.identities]
    if same:  # the same agent with another history: a rewrite (at 0: Claude Code's own compaction)
        scored = [(_common(req.ids, c.identities), k, c) for k, c in enumerate(same)]
        at, _, base = max(scored, key=lambda x: (x[0], x[1]))
        return Decision("segment", base.sid, "rewrite", at)
    if named and cands:
        return Decision("agent", cands[0].sid, "another agent under this name (its tools or system differ)", 0)
    return Decision("new", None, "new conversation", 0)


def in_family(sid: str, base: str) -> bool:
    """Whether ``sid`` is ``base`` or one of its numbered sessions (``base.2``, ``base.s3``, ``base.a1``)."""
    if sid == base:
        return True
    if not sid.startswith(base + "."):
        return False
    tail = sid[len(base) + 1:]
    return tail.isdigit() or (tail[:1] in ("s", "a") and tail[1:].isdigit())


def new_id(base: str, kind: Kind, named: bool, taken: set[str]) -> str:
    """The first free id for a new session of ``base``'s family: ``base`` itself, then
    ``base.s<n>`` for a segment and ``base.a<n>`` for another agent of a named session, and
    ``base.<n>`` for an unnamed one."""
    if base not in taken:
        return base
    sep = "." if not named else (".a" if kind == "agent" else ".s")
    n = 2
    while f"{base}{sep}{n}" in taken:
        n += 1
    return f"{base}{sep}{n}"


def family_order(sid: str) -> tuple[int, str]:
    """Members of a family in number order (``x``, ``x.2``, ``x.10``; ``x.s2``, ``x.s10``)."""
    tail = sid.rsplit(".", 1)[-1].lstrip("sa") if "." in sid else ""
    return (int(tail) if tail.isdigit() else 0, sid)
