"""Which session a request continues: the identity of its history and the one rule.

**The rule** (`decide`, for `wrap()`, compact mode and observe mode). A request is compared
with stored histories by the identity of **every** message (`transcript.message_hash`: forms
the API treats as one message have one identity), never by a sample. It is a pure function of
the request and the candidate histories of its *family* (the sessions under the request's name,
or, unnamed, the sessions whose first message is the request's first message):

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

Before 2-4, a **retry**: when a session of the family never had an answer (every request it
was sent ended in an error: the caller names these ``failed``) and the request opens with its
first message, the request takes that session over instead of starting another. The model never
saw the failed attempt, so nothing of it is fixed; Claude Code, refused a turn as too long,
sends it again rewritten (its own compaction), and each attempt was a new linked segment with
one error in it (issue 62: one conversation listed as 21 sessions at a 30k window).

Whichever it is, the request that goes out is rendered from a history equal, message by
message, to what the caller sent. The callers keep the candidates (`engine.registry`'s live
sessions, or the observe proxy's observed ones) and act on the decision; nothing here does I/O,
and nothing here loads the compaction runtime, so observe mode uses it alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import msgspec
import xxhash

from ..base.errors import InvalidSessionIdError
from ..base.headers import SESSION_HEADER
from ..base.wire import canonical_bytes, plain
from ..history.transcript import identity_of_bytes, message_hash
from ..store import check_session_id

__all__ = [
    "Candidate",
    "Decision",
    "Kind",
    "RequestHistory",
    "decide",
    "family_base",
    "family_key",
    "family_order",
    "in_family",
    "new_id",
    "preamble_key",
    "session_hint",
]


# -- the rule -------------------------------------------------------------------------------------

Kind = Literal["continue", "retry", "segment", "agent", "new"]


def _unmarked_blocks(value: Any) -> Any:
    """A system prompt or tool list without ``cache_control`` markers, a string system prompt as
    one text block (the forms the API caches as the same prefix)."""
    if isinstance(value, str):
        return [{"type": "text", "text": value}] if value else value
    if isinstance(value, list):
        return [{k: v for k, v in x.items() if k != "cache_control"} if isinstance(x, dict) else x for x in value]
    return value


def preamble_key(tools: Any, system: Any) -> bytes:
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
    """A request's preamble (its tools and system, `preamble_key`) and the identity of each of
    its messages, computed once per request."""

    preamble: bytes
    ids: list[bytes]
    # the identities of its mid-conversation ``role: "system"`` messages: instructions a client
    # appends alike to many conversations (Claude Code's sibling sub-agents share one), which never
    # say whose history a request is (`_rewrites`)
    system_ids: frozenset[bytes] = frozenset()

    @staticmethod
    def _system_ids(msgs: Any, ids: list[bytes]) -> frozenset[bytes]:
        return frozenset(i for m, i in zip(msgs, ids, strict=True) if isinstance(m, dict) and m.get("role") == "system")

    @classmethod
    def of(cls, body: dict[str, Any]) -> RequestHistory:
        msgs = body.get("messages")
        ids = [message_hash(m) for m in msgs] if isinstance(msgs, list) else []
        return cls(preamble_key(body.get("tools"), body.get("system")), ids,
                   cls._system_ids(msgs, ids) if ids else frozenset())

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
        ids = [identity_of_bytes(s, m) for s, m in zip(spans, msgs, strict=True)]
        return cls(preamble_key(body.get("tools"), body.get("system")), ids, cls._system_ids(msgs, ids))

    def fingerprint(self, *extra: Any) -> bytes:
        """xxh3-128 over the whole history (and ``extra``): equal exactly when the requests are."""
        h = xxhash.xxh3_128()
        h.update(self.preamble)
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
    def preamble(self) -> bytes: ...

    @property
    def identities(self) -> Sequence[bytes]: ...


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with a request: ``continue`` ``target``; take over ``target``, a session that
    never had an answer (``retry``: its history becomes the request's); or start a new session
    (``segment``, ``agent`` or ``new``) linked to ``target`` (None: linked to nothing).
    ``reason`` says why in words for events and the dashboard; ``at`` is the first message
    that differs from ``target`` (a rewrite), or its length."""

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


def decide(req: RequestHistory, candidates: Iterable[Candidate], *, named: bool,
           fixed_preamble: bool = True, failed: frozenset[str] = frozenset()) -> Decision:
    """The one rule (module docstring). ``candidates`` come in family order (the first session
    of the family first, the newest last, which breaks the remaining ties). ``fixed_preamble`` says
    whether a session's tools and system are fixed (a session with an immutable prefix); where
    they are not (the proxy's observe mode records requests and holds no prefix), a changed
    preamble continues the conversation and is reported there. ``failed``: the candidates whose
    every request has ended without an answer (none still under way), which a request that
    opens like them retries."""
    cands = list(candidates)
    best: Candidate | None = None
    for c in cands:
        ids = c.identities
        if not _extends(req.ids, ids) or (not ids and c.preamble != req.preamble):
            continue
        if best is None or len(ids) > len(best.identities) or \
                (len(ids) == len(best.identities) and (c.preamble == req.preamble or best.preamble != req.preamble)):
            best = c
    if best is not None:
        n = len(best.identities)
        if best.preamble == req.preamble or not fixed_preamble:
            return Decision("continue", best.sid, "extends", n)
    tried = [(_common(req.ids, c.identities), k, c) for k, c in enumerate(cands)
             if c.sid in failed and c.identities and c.identities[0] == req.ids[0]]
    if tried:  # the same turn again, after an attempt that got no answer: that attempt's session
        at, _, c = max(tried, key=lambda x: (x[0], x[1]))
        return Decision("retry", c.sid, "a retry of a request that got no answer", at)
    if best is not None:
        n = len(best.identities)
        if n >= 2:  # a conversation under way: its tools or system prompt changed
            return Decision("segment", best.sid, "prefix_churn", n)
        # one message in common is only a shared opening: another agent, not this conversation
    same = [c for c in cands if c.preamble == req.preamble and c.identities]
    if same:  # the same agent with another history, if it kept some of it: a rewrite
        scored = [(_common(req.ids, c.identities), k, c) for k, c in enumerate(same)]
        kept = [x for x in scored if _rewrites(req.ids, x[2], x[0], named, req.system_ids)]
        if kept:
            at, _, base = max(kept, key=lambda x: (x[0], x[1]))
            return Decision("segment", base.sid, "rewrite", at)
    if named and cands:
        why = ("another agent under this name (its tools or system differ)" if not same else
               "another agent under this name (same tools and system, none of a session's history kept)")
        return Decision("agent", cands[0].sid, why, 0)
    return Decision("new", None, "new conversation", 0)


def _is_agent(sid: str) -> bool:
    """Whether ``sid`` is another agent under a name (``<name>.a<n>``)."""
    tail = sid.rsplit(".", 1)[-1] if "." in sid else ""
    return tail[:1] == "a" and tail[1:].isdigit()


def _rewrites(req: list[bytes], c: Candidate, at: int, named: bool,
              system_ids: frozenset[bytes] = frozenset()) -> bool:
    """Whether a request that parts from ``c`` at ``at`` is ``c``'s own history rewritten.

    - It kept ``c``'s newest message after the change (a redacted or cleared old result, a
      framework that summarised the middle and kept the recent turns): a rewrite, named or not.
      A mid-conversation system message does not count as that message: a client appends the
      same one to many conversations (issue 50: 4 of 14 sibling sub-agents of Claude Code 2.1.328,
      sharing a trailing system message, were taken for rewrites of each other).
    - Under a name, on the owner's line (not a sub-agent's ``.aN``): Claude Code's own compaction
      opens with its summary (nothing in common, ``at`` 0), and a rewind goes back to an earlier
      turn of the same conversation (more than the opening in common).
    - Otherwise it shares only what every agent of the family shares, the opening message (and,
      under a name, a sub-agent's tools and system): another agent, not this conversation.
      Independent agents with the same first message are separate conversations, and a
      sub-agent of the same kind as an earlier one is another ``.aN``."""
    ids = c.identities
    newest = next((x for x in reversed(ids) if x not in system_ids), None)
    if newest is not None and newest in req[at:]:
        return True
    return named and not _is_agent(c.sid) and at != 1


def in_family(sid: str, base: str) -> bool:
    """Whether ``sid`` is ``base`` or one of its numbered sessions (``base.2``, ``base.s3``, ``base.a1``)."""
    if sid == base:
        return True
    if not sid.startswith(base + "."):
        return False
    tail = sid[len(base) + 1:]
    return tail.isdigit() or (tail[:1] in ("s", "a") and tail[1:].isdigit())


def family_base(sid: str) -> str:
    """The family ``sid`` belongs to: ``sid`` without its number (``job.s2`` -> ``job``)."""
    head = sid.rpartition(".")[0]
    return head if head and in_family(sid, head) else sid


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


def session_hint(headers: Mapping[str, str], body: Any) -> str | None:
    """The session a request names: the ``x-cachecompact-session`` header, else the client's own
    session metadata (Claude Code sends ``metadata.user_id``, a JSON string with ``session_id``).
    Raises `InvalidSessionIdError` for a header that could name a path."""
    h = headers.get(SESSION_HEADER)
    if h is not None:
        return check_session_id(h, SESSION_HEADER)
    meta = body.get("metadata") if isinstance(body, dict) else None
    uid = meta.get("user_id") if isinstance(meta, dict) else None
    if isinstance(uid, str) and uid.startswith("{"):
        try:
            sid = json.loads(uid).get("session_id")
        except (json.JSONDecodeError, AttributeError):
            return None
        if isinstance(sid, str):
            try:
                return check_session_id("cc-" + sid[:100], "metadata.user_id.session_id")
            except InvalidSessionIdError:
                return None
    return None
