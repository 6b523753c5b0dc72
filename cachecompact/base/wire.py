"""Messages API wire model: msgspec Structs for the blocks the engine reasons about.

Conversion from the plain dicts users pass to ``messages.create`` and back is lossless:
unknown fields are kept in ``extra`` and unknown block types become ``UnknownBlock``
holding the raw dict, so nothing the caller sent is ever dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import msgspec
import xxhash
from msgspec import UNSET, Struct, UnsetType

from .errors import MalformedMessageError

__all__ = [
    "Block",
    "DocumentBlock",
    "ImageBlock",
    "Message",
    "RedactedThinkingBlock",
    "TextBlock",
    "ThinkingBlock",
    "ToolDef",
    "ToolResultBlock",
    "ToolUseBlock",
    "UnknownBlock",
    "block_from_dict",
    "block_to_dict",
    "bytes_as_is",
    "call_key",
    "canonical_bytes",
    "message_from_dict",
    "message_to_dict",
    "plain",
    "result_text",
    "system_from_param",
    "tool_from_dict",
]

# The API's own pattern for tool_use ids; anything else is refused before it reaches a
# placeholder text, a log line or a file name.
TOOL_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,256}$")
ROLES = ("user", "assistant", "system")  # "system": a mid-conversation system message (Claude Code)

def _sdk_model_hook(obj: Any) -> Any:
    """Serialise SDK pydantic models exactly as the SDK itself puts them in a request body."""
    dump = getattr(obj, "model_dump", None)
    if dump is not None:
        return dump(exclude_unset=True, mode="json", by_alias=True, exclude=getattr(obj, "__api_exclude__", None))
    raise TypeError(f"cannot serialise {type(obj).__name__} in a Messages API body")


_ENCODER = msgspec.json.Encoder(order="sorted", enc_hook=_sdk_model_hook)
_AS_IS = msgspec.json.Encoder(enc_hook=_sdk_model_hook)


def plain(obj: Any) -> Any:
    """Turn SDK models and other mappings into plain JSON-able Python values."""
    return msgspec.to_builtins(obj, enc_hook=_sdk_model_hook)


def bytes_as_is(obj: Any) -> bytes:
    """JSON of ``obj`` in its own key order: a quick key for memoising what is computed from the
    value (equal bytes, equal value), never a canonical form to hash or send."""
    return _AS_IS.encode(obj)


def canonical_bytes(obj: Any) -> bytes:
    """The one encoding used for hashing and for sending: UTF-8 JSON, sorted keys, no spaces."""
    return _ENCODER.encode(obj)


class _Base(Struct, kw_only=True, omit_defaults=True):
    """Fields every block has: unknown keys live in ``extra`` so round trips are lossless."""

    TYPE: ClassVar[str] = ""
    # null is absent: the SDK types every block's marker Optional (``TextBlockParam.cache_control``)
    cache_control: dict[str, Any] | UnsetType | None = UNSET
    extra: dict[str, Any] = {}


class TextBlock(_Base):
    TYPE: ClassVar[str] = "text"
    text: str
    citations: list[Any] | UnsetType | None = UNSET


class ImageBlock(_Base):
    TYPE: ClassVar[str] = "image"
    source: dict[str, Any]


class DocumentBlock(_Base):
    TYPE: ClassVar[str] = "document"
    source: dict[str, Any]
    title: str | UnsetType | None = UNSET
    context: str | UnsetType | None = UNSET
    citations: dict[str, Any] | UnsetType | None = UNSET


class ToolUseBlock(_Base):
    TYPE: ClassVar[str] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Base):
    TYPE: ClassVar[str] = "tool_result"
    tool_use_id: str
    # str, or a list of text/image/document/... blocks (parsed into Block objects)
    content: str | list[Any] | UnsetType = UNSET
    is_error: bool | UnsetType = UNSET


class ThinkingBlock(_Base):
    TYPE: ClassVar[str] = "thinking"
    thinking: str
    signature: str | UnsetType = UNSET


class RedactedThinkingBlock(_Base):
    TYPE: ClassVar[str] = "redacted_thinking"
    data: str


class UnknownBlock(Struct, frozen=True):
    """A block type the engine does not model (server tools, compaction, ...): kept verbatim."""

    type: str
    raw: dict[str, Any]


Block = (
    TextBlock
    | ImageBlock
    | DocumentBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | UnknownBlock
)

_KNOWN: dict[str, type[_Base]] = {
    cls.TYPE: cls
    for cls in (TextBlock, ImageBlock, DocumentBlock, ToolUseBlock, ToolResultBlock, ThinkingBlock,
                RedactedThinkingBlock)
}


class Message(Struct, kw_only=True):
    role: str
    # the caller's form is kept: a plain string stays a string on the way back
    content: str | list[Block]
    extra: dict[str, Any] = {}


class ToolDef(Struct, kw_only=True):
    """A tool definition. Client tools have name/description/input_schema; server tools are opaque."""

    name: str
    raw: dict[str, Any]


def _bad(where: str, problem: str) -> MalformedMessageError:
    return MalformedMessageError(where, problem)


def _validation_problem(err: msgspec.ValidationError) -> tuple[str, str]:
    """Split msgspec's 'Expected x, got y - at `$.field`' into (suffix path, problem)."""
    text = str(err)
    m = re.search(r" - at `\$(.*)`$", text)
    if m:
        return m.group(1), text[: m.start()]
    return "", text


def block_from_dict(d: Any, where: str) -> Block:
    """Parse one content block; ``where`` names it in errors (``messages[2].content[0]``)."""
    d = plain(d) if not isinstance(d, dict) else d
    if not isinstance(d, dict):
        raise _bad(where, f"a content block must be an object, got {type(d).__name__}")
    btype = d.get("type")
    if not isinstance(btype, str) or not btype:
        raise _bad(f"{where}.type", "missing or not a string")
    cls = _KNOWN.get(btype)
    if cls is None:
        return UnknownBlock(type=btype, raw=dict(d))
    known = cls.__struct_fields__
    fields: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for k, v in d.items():
        if k == "type":
            continue
        if k in known and k != "extra":
            fields[k] = v
        else:
            extra[k] = v
    try:
        blk = msgspec.convert(fields, cls)
    except msgspec.ValidationError as err:
        suffix, problem = _validation_problem(err)
        raise _bad(f"{where}{suffix}", problem) from None
    if extra:
        blk = msgspec.structs.replace(blk, extra=extra)
    if isinstance(blk, ToolUseBlock):
        if not TOOL_ID_RE.match(blk.id):
            raise _bad(f"{where}.id", f"tool_use id {blk.id[:80]!r} must match {TOOL_ID_RE.pattern}")
    elif isinstance(blk, ToolResultBlock):
        if not TOOL_ID_RE.match(blk.tool_use_id):
            raise _bad(f"{where}.tool_use_id",
                       f"tool_use_id {blk.tool_use_id[:80]!r} must match {TOOL_ID_RE.pattern}")
        if isinstance(blk.content, list):
            inner = [block_from_dict(x, f"{where}.content[{j}]") for j, x in enumerate(blk.content)]
            blk = msgspec.structs.replace(blk, content=inner)
    return blk  # type: ignore[return-value]  # _KNOWN maps only to Block members


def block_to_dict(b: Block, *, strip_cache_control: bool = False) -> dict[str, Any]:
    """Inverse of `block_from_dict`; optionally without any ``cache_control`` marker."""
    if isinstance(b, UnknownBlock):
        if strip_cache_control and "cache_control" in b.raw:
            return {k: v for k, v in b.raw.items() if k != "cache_control"}
        return dict(b.raw)
    out: dict[str, Any] = {"type": b.TYPE}
    for name in b.__struct_fields__:
        if name == "extra":
            continue
        val = getattr(b, name)
        if val is UNSET or (strip_cache_control and name == "cache_control"):
            continue
        if name == "content" and isinstance(val, list):
            val = [block_to_dict(x, strip_cache_control=strip_cache_control) for x in val]
        out[name] = val
    if b.extra:
        for k, v in b.extra.items():
            if strip_cache_control and k == "cache_control":
                continue
            out[k] = v
    return out


def message_from_dict(d: Any, index: int) -> Message:
    """Parse and validate one message (shape only; pairing is checked by the transcript)."""
    where = f"messages[{index}]"
    if not isinstance(d, Mapping):
        d = plain(d)
    if not isinstance(d, Mapping):
        raise _bad(where, f"a message must be an object, got {type(d).__name__}")
    role = d.get("role")
    if role not in ROLES:
        raise _bad(f"{where}.role", f"unknown role {role!r}; expected 'user', 'assistant' or 'system'")
    if "content" not in d:
        raise _bad(f"{where}.content", "missing")
    content = d["content"]
    extra = {k: v for k, v in d.items() if k not in ("role", "content")}
    if isinstance(content, str):
        if not content:
            raise _bad(f"{where}.content", "empty string; the API rejects empty content")
        return Message(role=str(role), content=content, extra=dict(extra))
    if isinstance(content, (str, bytes)) or not isinstance(content, Iterable):
        raise _bad(f"{where}.content", f"must be a string or a list of blocks, got {type(content).__name__}")
    blocks = [block_from_dict(b, f"{where}.content[{j}]") for j, b in enumerate(content)]
    if not blocks:
        raise _bad(f"{where}.content", "empty list; the API rejects empty content")
    if role == "system" and not all(isinstance(b, TextBlock) for b in blocks):
        raise _bad(f"{where}.content", "a system message holds text blocks only")
    return Message(role=str(role), content=blocks, extra=dict(extra))


def message_to_dict(m: Message) -> dict[str, Any]:
    """Inverse of `message_from_dict`."""
    out: dict[str, Any] = {"role": m.role}
    out["content"] = m.content if isinstance(m.content, str) else [block_to_dict(b) for b in m.content]
    out.update(m.extra)
    return out


def tool_from_dict(d: Any, index: int) -> ToolDef:
    """Parse a tool definition; only ``name`` is required (server tools have no schema)."""
    where = f"tools[{index}]"
    d = plain(d)
    if not isinstance(d, dict):
        raise _bad(where, "a tool definition must be an object")
    name = d.get("name")
    if not isinstance(name, str) or not name:
        raise _bad(f"{where}.name", "missing or not a string")
    if "input_schema" in d and not isinstance(d["input_schema"], dict):
        raise _bad(f"{where}.input_schema", "must be an object")
    return ToolDef(name=name, raw=d)


def system_from_param(system: Any) -> list[TextBlock]:
    """Accept ``system`` as a string or as a list of text blocks; return text blocks."""
    if system is None or system is UNSET:
        return []
    if isinstance(system, str):
        return [TextBlock(text=system)] if system else []
    system = plain(system)
    if not isinstance(system, list):
        raise _bad("system", "must be a string or a list of text blocks")
    out: list[TextBlock] = []
    for j, b in enumerate(system):
        blk = block_from_dict(b, f"system[{j}]")
        if not isinstance(blk, TextBlock):
            raise _bad(f"system[{j}].type", "system blocks must be text blocks")
        out.append(blk)
    return out


def content_blocks(m: Message) -> list[Block]:
    """A message's content as blocks: a string content is one text block."""
    if isinstance(m.content, str):
        return [TextBlock(text=m.content)]
    return m.content


def tool_use_ids(m: Message) -> list[str]:
    return [b.id for b in content_blocks(m) if isinstance(b, ToolUseBlock)]


def tool_result_ids(m: Message) -> list[str]:
    return [b.tool_use_id for b in content_blocks(m) if isinstance(b, ToolResultBlock)]


def result_text(b: ToolResultBlock) -> str:
    """The text of a tool result (its text blocks joined by newlines; media has none)."""
    if isinstance(b.content, str):
        return b.content
    if isinstance(b.content, list):
        return "\n".join(getattr(x, "text", "") for x in b.content)
    return ""


def call_key(use: ToolUseBlock) -> bytes:
    """A tool call's identity (its name and canonical input): the same key means the same call again."""
    return xxhash.xxh3_128_digest(canonical_bytes([use.name, use.input]))
