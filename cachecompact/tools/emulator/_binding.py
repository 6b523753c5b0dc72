"""Preserved thinking in the emulator: signatures, the prefix check, readability, outcomes.

The rules, from the Claude API docs of December 2026 (build-with-claude/preserved-thinking,
.../preserved-thinking/prefix-checks, .../fix-bound-to-a-different-conversation, api/errors, and
Bedrock's claude-messages-thinking-block-binding; quoted in docs/cache-model.md, *Preserved
thinking*):

* **What a block is bound to.** "The top-level `system` prompt, `tools`, and `messages` before the
  block are its prefix. If the prefix differs from what you sent when the block was produced, that
  block and every later thinking block are invalid." Values are compared, not bytes;
  ``cache_control`` markers and every other request parameter are outside the prefix; earlier
  thinking blocks are not in it; a tool with ``defer_loading: true`` is not in it. The emulator
  compares each message in the canonical form docs/ledger-format.md gives (*Message identity*: a
  string and one text block, with or without ``cache_control``, are one message) without its
  thinking blocks. "With server-side compaction, the checked prefix starts at the most recent
  compaction block."
* **The chain.** "Each thinking block records which thinking block came before it, across turns.
  You can remove thinking blocks from the start of the history (oldest first), from the end, or
  all of them. What fails is a gap". A signature therefore records the block before it in the
  request that produced it, and a block whose recorded predecessor is not the kept block before
  it in the request fails like a changed prefix.
* **Readability.** A model reads its own blocks and a documented set of others' (`READS`); "If the
  current model can't read a block, the API drops it from that request without an error", and
  "prefix_mismatch_behavior has no effect on it". Haiku 5.5's blocks "are not locked to the model
  that produced them" (Bedrock).
* **Outcomes.** "Failing the prefix check might or might not result in a 400 error, depending on
  the model, so handle both cases." Fable 5.2 and Mythos 5.2 return the 400 on every account; Fable
  5.1 and Opus 5.5 on accounts created on or after 2026-08-31 (older accounts let the block through
  and, under the beta header, flag it as ``thinking_mismatch_allowed``). For Sonnet 5.5 and Haiku
  5.5 the docs we can read do not say, and for Mythos 5.1 they disagree, so those are a setting
  (`ThinkingRules.unset`) whose defaults are listed in `DEFAULT_UNSET`, and the tests run both.
* **The escape hatch.** ``thinking.block_binding.prefix_mismatch_behavior: "drop_block"`` (beta
  ``thinking-binding-controls-2026-08-01``): "the API drops each failing block and every thinking
  block after it, and the request succeeds"; the response lists each in ``input_transformations``.
  Without the header, ``block_binding`` is a 400 ending ``block_binding: Extra inputs are not
  permitted``.
* **The latest assistant message.** "With tool use, every `thinking` and `redacted_thinking` block
  from the assistant turn must be passed back exactly as received, including blocks whose
  `thinking` field is empty": a tool loop's latest assistant message that lost or changed a block
  the emulator issued with it is a 400 (`ThinkingRules.latest_tool_turn`, "strict"). The docs are
  read two ways where no tool is used (the edit table: removing blocks "from the end" is valid), so
  there the removal is accepted; "lenient" accepts it in a tool loop too, for the tests of both
  outcomes.
* **Billing.** "Usable blocks stay in context and are billed as input"; "Dropped blocks aren't
  billed". A block whose text was omitted (``display: "omitted"``, the default) is billed as the
  tokens the model thought, which its signature carries.

* **Signatures it did not issue.** A signature is the API's own sealed record; one it cannot
  decrypt (made up, or issued to another key) fails as "Invalid `signature` in `thinking` block"
  on every model (the troubleshooting docs list a tampered or undecryptable signature apart from
  the prefix check). The emulator holds no key of the API's, so it cannot tell a real signature
  from a forged one of the same shape; what it does is `ThinkingRules.foreign_signatures`:

  - ``"api_format"`` (the default, issue 56): a signature in the API's format (`api_shaped`:
    standard base64, padded, of at least `MIN_API_SIGNATURE_BYTES` bytes; every one in the
    shared 2025 and 2026 Claude Code logs decodes to 190 bytes or more) is accepted as the API
    accepts the signatures it issued, and bound to the prefix and predecessor it is first sent
    with; a made-up one (``"AAAA"``, ``"sig"``) is refused. A real client resuming a session
    recorded against the API (Claude Code's log, a replay) sends such signatures, and the API
    takes them;
  - ``"refuse"``: every signature the emulator did not issue is refused (tests that want the
    strict reading);
  - ``"bind"``: every one is bound, made-up ones included (corpora whose blocks carry
    placeholder signatures).

  What a foreign signature can be checked for, once bound: that its block's text is the text
  it was first sent with, and (on a model with preserved thinking) that the prefix before it
  and the block before it are what they were when it was first sent (an edit or a gap after
  that fails as for the emulator's own). What it cannot be checked for: the prefix it was
  produced after (before its first sight), the model that produced it (any model reads it),
  the account it is bound to, and the tokens thought (those of its text, or the hint a
  replaying responder gave). A signature in the emulator's own format (``emu2.``) that fails
  its HMAC is always refused.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import xxhash

from ...base.errors import MalformedMessageError
from ...base.pricing import PRESERVED_THINKING
from ...base.wire import canonical_bytes

__all__ = [
    "BETA",
    "DEFAULT_UNSET",
    "MIN_API_SIGNATURE_BYTES",
    "PRESERVED",
    "READS",
    "Outcome",
    "Signer",
    "ThinkingCheck",
    "ThinkingRules",
    "Verdict",
    "api_shaped",
    "can_read",
    "message_key",
    "preserved",
]

BETA = "thinking-binding-controls-2026-08-01"
PRESERVED = PRESERVED_THINKING  # the prefix-checks page's supportedModels
# Who reads whose blocks besides its own (preserved-thinking, *Switching models*; Fable 5.2's what's-new
# page; Bedrock's thinking-block-binding page):
# - Fable/Mythos 5.1 "read thinking blocks produced by each other and by earlier Claude models", and "on the
#   Claude API, Claude Fable 5.1 and Claude Mythos 5.1 read thinking blocks from Claude Opus 5.5";
# - Opus 5.5 "reads thinking blocks from Claude Opus 5 and earlier Opus, Sonnet, and Haiku models, but not
#   from Claude Fable or Claude Mythos models";
# - "Only Claude Fable 5.2 and Claude Mythos 5.2 read Claude Fable 5.2 thinking blocks";
# - Haiku 5.5's blocks "are not locked to the model that produced them", and "a block produced by a
#   different model and replayed on Claude Haiku 5.5 is dropped".
# Not stated, our choice: the 5.2 pair also reads what the 5.1 pair reads, and Sonnet 5.5 reads like Opus 5.5.
# A model before preserved thinking runs no model check. Each entry: (preserved producers it reads,
# whether it reads earlier models, whether those include Fable and Mythos).
READS: dict[str, tuple[frozenset[str], bool, bool]] = {
    "claude-fable-5-2": (frozenset({"claude-mythos-5-2", "claude-fable-5-1", "claude-mythos-5-1", "claude-opus-5-5"}),
                         True, True),
    "claude-mythos-5-2": (frozenset({"claude-fable-5-2", "claude-fable-5-1", "claude-mythos-5-1", "claude-opus-5-5"}),
                          True, True),
    "claude-fable-5-1": (frozenset({"claude-mythos-5-1", "claude-opus-5-5"}), True, True),
    "claude-mythos-5-1": (frozenset({"claude-fable-5-1", "claude-opus-5-5"}), True, True),
    "claude-opus-5-5": (frozenset(), True, False),
    "claude-sonnet-5-5": (frozenset(), True, False),
    "claude-haiku-5-5": (frozenset(), False, False),
}
UNLOCKED = frozenset({"claude-haiku-5-5"})  # blocks any model reads


Outcome = Literal["error", "drop", "allow"]
# What a request that leaves prefix_mismatch_behavior unset gets for a block that fails the prefix check.
# Documented: Fable/Mythos 5.2 "error" on every account; Fable 5.1 and Opus 5.5 "error" for accounts
# created on or after 2026-08-31 ("allow" for older ones: `ThinkingRules.account_before_2026_08_31`).
# Not settled by the docs, a setting (the tests run both outcomes): Mythos 5.1 (the newest page says it
# errors; an older one and Bedrock say it does not check), Sonnet 5.5 and Haiku 5.5 ("might or might not
# result in a 400 error, depending on the model"); their defaults below are our choice.
DEFAULT_UNSET: dict[str, Outcome] = {
    "claude-fable-5-2": "error", "claude-mythos-5-2": "error", "claude-fable-5-1": "error",
    "claude-opus-5-5": "error", "claude-mythos-5-1": "error", "claude-sonnet-5-5": "drop", "claude-haiku-5-5": "drop",
}
_ACCOUNT_AGED = frozenset({"claude-fable-5-1", "claude-opus-5-5"})  # "allow" on accounts older than 2026-08-31


def preserved(model: str) -> bool:
    """Whether ``model`` (a table id) runs the prefix check."""
    return model in PRESERVED


def can_read(reader: str, producer: str) -> bool:
    """Whether ``reader`` reads a thinking block ``producer`` made (the documented matrix, `READS`);
    ``"*"`` is a block the emulator could not verify and bound where it was first sent."""
    if reader == producer or producer in UNLOCKED or producer == "*" or reader not in READS:
        return True
    others, earlier, fable = READS[reader]
    if producer in PRESERVED:
        return producer in others
    return earlier and (fable or not producer.startswith(("claude-fable", "claude-mythos")))


ForeignSignatures = Literal["api_format", "refuse", "bind"]
FOREIGN_SIGNATURES: tuple[str, ...] = ("api_format", "refuse", "bind")
# the shortest signature (decoded) the emulator takes for the API's: the shortest in the shared Claude Code
# logs of 2025 and 2026 (2,096 signatures and redacted blocks) decodes to 190 bytes
MIN_API_SIGNATURE_BYTES = 64


def api_shaped(sig: str) -> bool:
    """Whether ``sig`` has the format of the API's signatures (and ``redacted_thinking`` data):
    standard base64 with its padding, decoding to at least `MIN_API_SIGNATURE_BYTES` bytes. Its
    shape only: nothing without the API's key can tell whether the API issued it."""
    if len(sig) % 4 or len(sig) < 4 * -(-MIN_API_SIGNATURE_BYTES // 3):
        return False
    try:
        return len(base64.b64decode(sig, validate=True)) >= MIN_API_SIGNATURE_BYTES
    except ValueError:  # binascii.Error
        return False


@dataclass(frozen=True, slots=True)
class ThinkingRules:
    """The emulator's settings for what the docs leave open (each documented in the module docstring)."""

    unset: Mapping[str, Outcome] = field(default_factory=lambda: dict(DEFAULT_UNSET))
    account_before_2026_08_31: bool = False  # an older account: Fable 5.1 and Opus 5.5 let failing blocks through
    latest_tool_turn: Literal["strict", "lenient"] = "strict"
    # a signature this emulator never issued (see the module docstring): "api_format" binds one in the
    # API's format where it is first sent and refuses a made-up one; "refuse" refuses every one (as the
    # API refuses one it cannot decrypt: "Invalid `signature` in `thinking` block"); "bind" binds every one
    foreign_signatures: ForeignSignatures = "api_format"

    def __post_init__(self) -> None:
        if self.foreign_signatures not in FOREIGN_SIGNATURES:
            raise ValueError(f"foreign_signatures must be one of {', '.join(FOREIGN_SIGNATURES)}, got "
                             f"{self.foreign_signatures!r}")

    def outcome(self, model: str, asked: str | None) -> Outcome:
        """What a failing block gets on ``model`` when the request asked ``asked`` (None: unset)."""
        if asked == "drop_block":
            return "drop"
        if asked == "error":
            return "error"
        if self.account_before_2026_08_31 and model in _ACCOUNT_AGED:
            return "allow"
        return self.unset.get(model, "error")


# -- canonical forms: what the prefix check compares ----------------------------------------------------

def _strip(b: Any) -> Any:
    if not isinstance(b, dict):
        return b
    out = {k: v for k, v in b.items() if k != "cache_control" and v is not None}
    if out.get("type") == "tool_result":
        c = out.get("content")
        if isinstance(c, str):
            out["content"] = [{"type": "text", "text": c}] if c else []
        elif isinstance(c, list):
            out["content"] = [_strip(x) for x in c]
    return out


_THINKING = ("thinking", "redacted_thinking")
_SKIPPED = (*_THINKING, "compaction")  # a compaction block is where the prefix starts, not part of a message


def message_key(m: Any) -> bytes:
    """A message's value for the prefix check: its canonical form (docs/ledger-format.md, *Message
    identity*) without thinking blocks, which are not part of any block's prefix."""
    if not isinstance(m, dict):
        return xxhash.xxh3_128_digest(canonical_bytes(m))
    c = m.get("content")
    blocks = [{"type": "text", "text": c}] if isinstance(c, str) else c if isinstance(c, list) else []
    kept = [_strip(b) for b in blocks if not (isinstance(b, dict) and b.get("type") in _SKIPPED)]
    return xxhash.xxh3_128_digest(canonical_bytes([m.get("role"), kept]))


def preamble_key(body: Mapping[str, Any]) -> bytes:
    """``system`` and the tools not deferred, canonical (string system = one text block)."""
    system = body.get("system")
    sys_blocks = [{"type": "text", "text": system}] if isinstance(system, str) else system or []
    tools = [_strip(t) for t in body.get("tools") or [] if isinstance(t, dict) and not t.get("defer_loading")]
    return xxhash.xxh3_128_digest(canonical_bytes([[_strip(b) for b in sys_blocks], tools]))


def _step(d: bytes, key: bytes) -> bytes:
    return xxhash.xxh3_128_digest(d + key)


# -- signatures --------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Binding:
    """What a signature records: who made the block, the prefix it was made after, the block
    before it, its own text, and the tokens the model thought."""

    model: str
    prefix: str
    prev: str
    text: str
    tokens: int


class Signer:
    """Makes and reads the emulator's signatures, and binds foreign ones on first sight."""

    PREFIX = "emu2."

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self._foreign: dict[str, Binding] = {}  # a signature we cannot verify -> what it was first sent with

    def sign(self, b: Binding) -> str:
        payload = base64.urlsafe_b64encode(json.dumps([b.model, b.prefix, b.prev, b.text, b.tokens]).encode()).decode()
        mac = hmac.new(self._secret, payload.encode(), hashlib.sha256).hexdigest()[:32]
        return f"{self.PREFIX}{payload}.{mac}"

    def read(self, sig: str) -> Binding | None:
        """The binding of one of our signatures; None when it is not ours or does not verify."""
        if not sig.startswith(self.PREFIX):
            return None
        payload, _, mac = sig[len(self.PREFIX):].rpartition(".")
        want = hmac.new(self._secret, payload.encode(), hashlib.sha256).hexdigest()[:32]
        if not payload or not hmac.compare_digest(mac, want):
            return None
        try:
            model, prefix, prev, text, tokens = json.loads(base64.urlsafe_b64decode(payload.encode()))
        except (ValueError, TypeError):
            return None
        return Binding(str(model), str(prefix), str(prev), str(text), int(tokens))

    def foreign(self, sig: str) -> Binding | None:
        return self._foreign.get(sig)

    def bind_foreign(self, sig: str, b: Binding) -> None:
        if len(self._foreign) > 500_000:
            self._foreign.clear()
        self._foreign.setdefault(sig, b)


def sig_id(sig: str) -> str:
    """A short, stable name of a signature, which the next block records as its predecessor."""
    return xxhash.xxh3_64_hexdigest(sig.encode())


def text_id(text: str) -> str:
    return xxhash.xxh3_64_hexdigest(text.encode())


# -- the check of one request -------------------------------------------------------------------------

@dataclass(slots=True)
class Verdict:
    """What the API does with a request's thinking blocks."""

    dropped: list[tuple[int, int, str]] = field(default_factory=list)  # (message, block, reason)
    allowed: list[tuple[int, int]] = field(default_factory=list)  # failing, let through: thinking_mismatch_allowed
    kept: int = 0  # blocks that reach the model
    # the turns the request shows that the emulator answered: the thinking it issued with them (tokens), the
    # blocks of it left out of the request, and the tokens of it that reach the model valid
    issued_tokens: int = 0
    stripped: int = 0
    kept_tokens: int = 0
    tokens: dict[tuple[int, int], int] = field(default_factory=dict)  # (message, block) -> tokens billed as input
    last_sig: str = ""  # the kept block a new one follows ("" for none)

    def transformations(self) -> list[dict[str, str]]:
        out = [{"type": "thinking_dropped", "path": f"messages.{i}.content.{j}", "reason": r}
               for i, j, r in self.dropped]
        out += [{"type": "thinking_mismatch_allowed", "path": f"messages.{i}.content.{j}",
                 "reason": "prefix_binding_mismatch"} for i, j in self.allowed]
        return sorted(out, key=lambda x: [int(p) for p in x["path"].split(".")[1::2]])


def turn_key(content: Sequence[Any]) -> bytes:
    """What names an assistant turn across requests: its first tool call's id, else its text (a
    turn keeps these when compaction edits it: a cleared call keeps its id)."""
    for b in content:
        if isinstance(b, dict) and b.get("type") == "tool_use":
            return b"u" + str(b.get("id")).encode()
    text = [b.get("text") for b in content if isinstance(b, dict) and b.get("type") == "text"]
    return b"t" + xxhash.xxh3_128_digest(canonical_bytes(text))


def _bad(where: str, problem: str) -> MalformedMessageError:
    return MalformedMessageError(where, problem)


BOUND_MESSAGE = ("Invalid `signature` in `thinking` block. The block is bound to a different conversation. Remove "
                 "the block, or set `thinking.block_binding.prefix_mismatch_behavior` to \"drop_block\".")
NEEDS_HEADER = f" That setting requires the `{BETA}` value in the `anthropic-beta` header."
TAMPERED = "Invalid `signature` in `thinking` block"
LATEST = ("`thinking` or `redacted_thinking` blocks in the latest assistant message cannot be modified. These blocks "
          "must remain as they were in the original response.")


def _index_of_compaction(content: list[Any]) -> int:
    """The position of the last compaction block in a message's content (-1 without one)."""
    return max((j for j, b in enumerate(content) if isinstance(b, dict) and b.get("type") == "compaction"), default=-1)


def last_compaction(msgs: Sequence[Any]) -> tuple[int, dict[str, Any] | None]:
    """The index of the message with the most recent compaction block, and the block (0 and None
    without one): where the checked prefix starts."""
    for i in range(len(msgs) - 1, -1, -1):
        c = msgs[i].get("content") if isinstance(msgs[i], dict) else None
        found = [b for b in c if isinstance(b, dict) and b.get("type") == "compaction"] if isinstance(c, list) else []
        if found:
            return i, found[-1]
    return 0, None


class ThinkingCheck:
    """The check of every thinking block a request sends back (see the module docstring)."""

    def __init__(self, signer: Signer, rules: ThinkingRules) -> None:
        self.signer, self.rules = signer, rules
        self._issued: dict[str, tuple[str, ...]] = {}  # a response's first tool_use id -> the signatures it issued
        # every response's turn key -> the tokens of each thinking block it issued (for what a request leaves out)
        self._turns: dict[bytes, tuple[int, ...]] = {}

    def prefixes(self, body: Mapping[str, Any], recorded: str | None = None) -> list[bytes]:
        """The prefix digest before each message, and after the last one. "With server-side
        compaction, the checked prefix starts at the most recent compaction block"; a signed
        on-demand block stands for the messages it summarized (``recorded``: the digest they left),
        so the kept turns after it are checked as if those messages were still there."""
        msgs = body.get("messages") or []
        start, block = last_compaction(msgs)
        d = preamble_key(body)
        if block is not None:
            d = bytes.fromhex(recorded) if recorded else _step(d, canonical_bytes(block.get("content")))
        out = [d] * (start + 1)
        for k, m in enumerate(msgs[start:]):
            c = m.get("content") if isinstance(m, dict) else None
            if k == 0 and block is not None and isinstance(c, list):
                rest = c[[id(b) for b in c].index(id(block)) + 1:]
                if rest:  # the block's own message counts from after the block
                    d = _step(d, message_key({**m, "content": rest}))
            else:
                d = _step(d, message_key(m))
            out.append(d)
        return out

    @staticmethod
    def within(prefix: bytes, blocks: Sequence[Any], j: int) -> str:
        """The prefix of block ``j`` of a message: the prefix before the message and its blocks
        before ``j`` that are not thinking."""
        head = [_strip(b) for b in blocks[:j] if not (isinstance(b, dict) and b.get("type") in _SKIPPED)]
        return _step(prefix, canonical_bytes(head)).hex() if head else prefix.hex()

    def check(self, body: Mapping[str, Any], model: str, asked: str | None, has_beta: bool,
              hints: Mapping[str, int] | None = None, recorded: str | None = None) -> Verdict:
        """Walk the thinking blocks in request order: readability, signature, prefix and chain;
        raise the documented 400 or decide which blocks are dropped or let through."""
        v = Verdict()
        msgs = body.get("messages") or []
        pre = self.prefixes(body, recorded)
        prev = ""  # the kept block the next one must follow ("" before any)
        failing = False  # once a block is dropped, every later one is (the chain)
        outcome = self.rules.outcome(model, asked) if preserved(model) else "allow"
        latest = max((i for i, m in enumerate(msgs) if isinstance(m, dict) and m.get("role") == "assistant"),
                     default=-1)
        start, _ = last_compaction(msgs)
        for i, m in enumerate(msgs):
            c = m.get("content") if isinstance(m, dict) else None
            if not isinstance(c, list) or i < start:  # before a compaction block: the server drops it unchecked
                continue
            first = _index_of_compaction(c) + 1 if i == start else 0
            for j, b in enumerate(c):
                if not isinstance(b, dict) or b.get("type") not in _THINKING or j < first:
                    continue
                where = f"messages.{i}.content.{j}"
                sig = str(b.get("signature") or b.get("data") or "")
                text = str(b.get("thinking", "")) if b.get("type") == "thinking" else ""
                if not sig:
                    raise _bad(where, TAMPERED)
                here = self.within(pre[i] if i < len(pre) else pre[-1], c, j)
                bound = self.signer.read(sig)
                if bound is None and sig.startswith(Signer.PREFIX):
                    raise _bad(where, TAMPERED)  # ours, changed: a different failure, always a 400
                if bound is None and not self._takes_foreign(sig):
                    raise _bad(where, TAMPERED)  # not one we issued, nor of the API's shape: made up
                if bound is None:
                    bound = self.signer.foreign(sig)
                    if bound is None:  # a block we cannot verify: bound to where it is first sent
                        n = (hints or {}).get(sig, 0)
                        bound = Binding("*", here, prev, text_id(text), n)
                        self.signer.bind_foreign(sig, bound)
                if b.get("type") == "thinking" and text and text_id(text) != bound.text:
                    raise _bad(where, TAMPERED)  # the text a signature was issued (or first sent) with, changed
                tokens = bound.tokens
                if not can_read(model, bound.model):
                    v.dropped.append((i, j, "model_binding_mismatch"))
                    continue
                fails = failing or bound.prefix != here or (prev != "" and bound.prev != prev)
                if fails and preserved(model):
                    if outcome == "error":
                        raise _bad(where, BOUND_MESSAGE + ("" if has_beta else NEEDS_HEADER))
                    if outcome == "drop":
                        failing = True
                        v.dropped.append((i, j, "prefix_binding_mismatch"))
                        continue
                    v.allowed.append((i, j))
                v.kept += 1
                v.tokens[(i, j)] = tokens
                prev = sig_id(sig)
            if i == latest:
                self._latest(c, i, v)
            if isinstance(m, dict) and m.get("role") == "assistant":
                self._account(c, i, v)
        v.last_sig = prev
        return v

    def _takes_foreign(self, sig: str) -> bool:
        """Whether a signature the emulator did not issue is taken (`ThinkingRules.foreign_signatures`)."""
        mode = self.rules.foreign_signatures
        return mode == "bind" or (mode == "api_format" and api_shaped(sig))

    def _account(self, content: list[Any], i: int, v: Verdict) -> None:
        """For a turn the emulator answered: the thinking it issued, what the request left out of
        it, and what of it reaches the model valid ("reasoning kept")."""
        issued = self._turns.get(turn_key(content))
        if issued is None:
            return
        sent = [j for j, b in enumerate(content) if isinstance(b, dict) and b.get("type") in _THINKING]
        v.issued_tokens += sum(issued)
        v.stripped += max(0, len(issued) - len(sent))
        v.kept_tokens += sum(v.tokens.get((i, j), 0) for j in sent)

    def _latest(self, content: list[Any], i: int, v: Verdict) -> None:
        """A tool loop's latest assistant message must carry every block issued with it, unchanged."""
        if self.rules.latest_tool_turn != "strict":
            return
        uses = [b.get("id") for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
        issued = self._issued.get(str(uses[0])) if uses else None
        if not issued:
            return
        sent = tuple(str(b.get("signature") or b.get("data") or "") for b in content
                     if isinstance(b, dict) and b.get("type") in _THINKING)
        if sent != issued:
            j = next((k for k, b in enumerate(content) if isinstance(b, dict) and b.get("type") in _THINKING), 0)
            raise _bad(f"messages.{i}.content.{j}", LATEST)

    def issued(self, content: Sequence[Mapping[str, Any]], tokens: Sequence[int] = ()) -> None:
        """Remember what a response issued: the signatures with its tool calls (for `_latest`), and
        the tokens of each thinking block (for what later requests leave out of the turn)."""
        uses = [b.get("id") for b in content if b.get("type") == "tool_use"]
        sigs = tuple(str(b.get("signature") or b.get("data") or "") for b in content if b.get("type") in _THINKING)
        if len(self._issued) > 500_000:
            self._issued.clear()
            self._turns.clear()
        if uses and sigs:
            self._issued[str(uses[0])] = sigs
        if sigs:
            self._turns[turn_key(content)] = tuple(tokens) if len(tokens) == len(sigs) else (0,) * len(sigs)


# -- the request's thinking configuration ---------------------------------------------------------------

# models on which thinking cannot be turned off or given a budget (their what's-new pages: "thinking cannot
# be disabled"; the errors page's `"thinking.type.disabled" is not supported for this model`)
ADAPTIVE_ONLY = frozenset({"claude-opus-5-5", "claude-fable-5-1", "claude-mythos-5-1", "claude-fable-5-2",
                           "claude-mythos-5-2"})
BETWEEN_TOOLS = frozenset({"claude-sonnet-5-5"})  # `thinking: {"type": "between_tools"}` (Sonnet 5.5's page)
DISPLAYS = ("summarized", "omitted", "updates")


@dataclass(frozen=True, slots=True)
class Config:
    """What a request asks of thinking: whether the model thinks, how, and what it asked failing
    blocks to get (``prefix_mismatch_behavior``, None when unset)."""

    on: bool
    mode: str  # "adaptive" | "enabled" | "between_tools" | "disabled"
    display: str
    asked: str | None


def config(body: Mapping[str, Any], model: str, betas: set[str]) -> Config:
    """The request's ``thinking`` parameter, checked as the API checks it on ``model``. Models with
    preserved thinking think adaptively when the parameter is absent ("these models think
    adaptively by default")."""
    th = body.get("thinking")
    if th is None:
        return Config(preserved(model), "adaptive" if preserved(model) else "disabled", "omitted", None)
    if not isinstance(th, dict):
        raise _bad("thinking", "must be an object")
    mode = th.get("type")
    if "block_binding" in th and BETA not in betas:
        raise _bad("thinking.block_binding", "Extra inputs are not permitted")
    asked = None
    bb = th.get("block_binding")
    if bb is not None:
        if mode not in ("adaptive", "enabled"):
            raise _bad("thinking.block_binding", f"is accepted with thinking.type 'adaptive' or 'enabled', not "
                                                 f"{mode!r}")
        if not isinstance(bb, dict) or set(bb) - {"prefix_mismatch_behavior"}:
            raise _bad("thinking.block_binding", "must be {'prefix_mismatch_behavior'?: 'error' | 'drop_block'}")
        asked = bb.get("prefix_mismatch_behavior")
        if asked not in (None, "error", "drop_block"):
            raise _bad("thinking.block_binding.prefix_mismatch_behavior", "Input should be 'error' or 'drop_block'")
    display = th.get("display", "omitted")
    if display not in DISPLAYS:
        raise _bad("thinking.display", f"Input should be {', '.join(map(repr, DISPLAYS))}")
    if mode == "between_tools" and model not in BETWEEN_TOOLS:
        raise _bad("thinking.type", f"'between_tools' is not supported for {model}")
    if mode == "disabled" and model in BETWEEN_TOOLS:
        raise _bad("thinking.type", '"thinking.type.disabled" is not supported for this model. Use '
                                    '"thinking.type.between_tools" to turn off up-front thinking.')
    if mode in ("disabled", "enabled") and model in ADAPTIVE_ONLY:
        raise _bad("thinking.type", f'"thinking.type.{mode}" is not supported for this model. Use '
                                    '"thinking.type.adaptive" and "output_config.effort" to control thinking behavior.')
    if mode == "between_tools":
        oc = body.get("output_config")
        effort = oc.get("effort") if isinstance(oc, dict) else None
        if effort in ("xhigh", "max"):
            raise _bad("output_config.effort", "thinking.type 'between_tools' is available at effort low, medium "
                                               "and high")
    return Config(mode in ("enabled", "adaptive", "between_tools"), str(mode), str(display), asked)


def thought_tokens(answer_tokens: int) -> int:
    """How much the emulator's model thinks before an answer of ``answer_tokens`` (our model: as
    much as it answers, at least 32 tokens). Billed as output, and as input when sent back."""
    return max(32, answer_tokens)
