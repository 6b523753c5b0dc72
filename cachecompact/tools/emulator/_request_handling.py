"""Request handling for the emulator, independent of the HTTP layer.

`EmulatorCore.handle` takes a method, path, headers and raw body and returns an
`HttpReply` (status, headers, and either a JSON body or a list of SSE events). Usage comes
from the `CacheSimulator`; every request is appended to the request log.
"""

from __future__ import annotations

import json
import math
import random
import re
import secrets
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgspec
import xxhash

from ...base.errors import MalformedMessageError, UnknownModelError
from ...base.headers import CLOCK_HEADER, INTERNAL_HEADER, SESSION_HEADER
from ...base.pricing import get_model
from ...base.safefs import append_bytes
from ...base.tokens import TokenCounter
from ...base.wire import canonical_bytes
from ...cache.simulator import CacheSimulator, SimBlock, SimRequest, SimResult, request_from_body
from . import _binding as th, _ondemand_compaction as ondemand
from ._compaction import CompactEdit, after_last_compaction, compact_edit, summary_block, summary_prompt
from ._context_editing import apply_context_management
from ._versions import check_version, version_of
from .responders import Reply, Responder, ResponderFn, ScriptedResponder, SummarizingResponder
from .validation import MessageInfo, check_message, check_request

__all__ = ["CLOCK_HEADER", "INTERNAL_HEADER", "EmulatorCore", "FaultConfig", "HttpReply", "output_tokens"]

_WHERE = re.compile(r"^messages\[(\d+)\]\.content\[(\d+)\]$")
_ROUTES = {"/v1/messages": "messages", "/v1/messages/count_tokens": "count_tokens", "/v1/models": "models"}
_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_INFOS = "\x00infos"  # where _decode leaves the per-message checks for the request check


def output_tokens(content: list[dict[str, Any]], counter: TokenCounter, ratio: float = 1.0) -> int:
    """What a reply bills as output before the ``max_tokens`` cap: its text, thinking and tool
    inputs (as JSON), scaled by the model family's token ratio."""
    return round(ratio * sum(counter.count_text(json.dumps(b.get("input")) if b.get("type") == "tool_use"
                                                else str(b.get("text", b.get("thinking", "")))) for b in content))


def _as_responder(responder: Any) -> Responder:
    """A responder as given, or a bare function of the request body wrapped as one (the README's
    ``Emulator(lambda body: "hi")``); anything else is refused here, not with a 500 per request."""
    if responder is None:
        return SummarizingResponder(ScriptedResponder())
    if callable(getattr(responder, "respond", None)):
        return responder  # type: ignore[no-any-return]
    if callable(responder):
        return SummarizingResponder(ScriptedResponder(responder))
    raise TypeError(f"responder must have a respond(body) method or be a function of the request body returning "
                    f"a string, a dict of content blocks or a Reply; got {type(responder).__name__}")


def _short(err: BaseException) -> str:
    return "nesting too deep" if isinstance(err, RecursionError) else str(err)[:200]
_ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error",
                408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                529: "overloaded_error"}


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """Injected failures: each request fails with probability ``rate`` (status drawn from
    ``statuses``) and is delayed by ``slow_seconds`` with probability ``slow_rate``; seeded."""

    rate: float = 0.0
    statuses: tuple[int, ...] = (429, 529, 500)
    slow_rate: float = 0.0
    slow_seconds: float = 0.2
    seed: int = 0
    retry_after_ms: int = 5
    paths: tuple[str, ...] = ("/v1/messages",)

    def __post_init__(self) -> None:
        if not (0.0 <= self.rate <= 1.0 and 0.0 <= self.slow_rate <= 1.0):
            raise ValueError("fault rates must be between 0 and 1")
        if any(s not in _ERROR_TYPES for s in self.statuses):
            raise ValueError(f"fault statuses must be among {sorted(_ERROR_TYPES)}")


@dataclass(slots=True)
class HttpReply:
    status: int
    headers: dict[str, str]
    body: bytes = b""
    events: list[tuple[str, dict[str, Any]]] | None = None  # SSE stream when set

    def sse(self) -> Iterator[bytes]:
        for name, data in self.events or []:
            yield b"event: " + name.encode() + b"\ndata: " + json.dumps(data).encode() + b"\n\n"


@dataclass(slots=True)
class _Fingerprint:
    """What diagnostics compare: structure hashes and token counts of one request + its reply."""

    model: bytes
    tools: bytes
    system: bytes
    params: bytes
    messages: list[bytes]
    cum_tokens: list[int]  # tokens up to the end of each message (from the simulator)
    head_tokens: tuple[int, int]  # tokens of tools, and of tools + system


def _block_key(b: Any) -> bytes:
    if isinstance(b, dict):
        b = {k: v for k, v in b.items() if k != "cache_control" and v is not None}
    return xxhash.xxh3_128_digest(canonical_bytes(b))


def _message_key(m: dict[str, Any]) -> bytes:
    content = m.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
    return xxhash.xxh3_128_digest(canonical_bytes(m.get("role")) + b"".join(_block_key(b) for b in blocks))


class EmulatorCore:
    """Thread-safe: one lock serialises billing so cache state follows request order."""

    def __init__(
        self,
        responder: Responder | ResponderFn | None = None,
        *,
        faults: FaultConfig | None = None,
        log_path: str | Path | None = None,
        counter: TokenCounter | None = None,
        context_window: int | None = None,
        thinking: th.ThinkingRules | None = None,
    ) -> None:
        self.responder: Responder = _as_responder(responder)
        self.faults = faults or FaultConfig()
        self._rng = random.Random(self.faults.seed)
        self.counter = counter or TokenCounter()
        self.sim = CacheSimulator(lambda m: get_model(m).min_cacheable)
        self.context_window = context_window  # overrides every model's window (benchmarks at small windows)
        self._secret = secrets.token_bytes(16)  # signs thinking and compaction blocks
        self.signer = th.Signer(self._secret)
        self.thinking = th.ThinkingCheck(self.signer, thinking or th.ThinkingRules())
        # every 400 the prefix check or the latest-turn rule gave, by message: what a test counts as refused
        self.refusals: list[dict[str, Any]] = []
        self.log: list[dict[str, Any]] = []
        self.log_path = Path(log_path) if log_path else None
        self._fingerprints: dict[str, _Fingerprint] = {}
        self._blocks_memo: dict[tuple[bytes, int], tuple[list[SimBlock], bool]] = {}
        self._msg_memo: dict[bytes, tuple[Any, MessageInfo]] = {}  # raw message bytes -> (message, checks)
        self._clearing: dict[bytes, int] = {}  # context editing state per conversation
        self._lock = threading.Lock()
        self._n = 0

    # -- helpers -----------------------------------------------------------------------------

    def _next_ids(self) -> tuple[str, str]:
        self._n += 1
        return f"req_emu_{self._n:08d}", f"msg_emu_{self._n:08d}"

    @staticmethod
    def _error(status: int, message: str, request_id: str, extra_headers: dict[str, str] | None = None,
               error_type: str | None = None, code: str | None = None) -> HttpReply:
        err: dict[str, Any] = {"type": error_type or _ERROR_TYPES.get(status, "api_error"), "message": message}
        if code is not None:
            err["details"] = {"error_code": code}
        body = {"type": "error", "error": err, "request_id": request_id}
        headers = {"content-type": "application/json", "request-id": request_id, **(extra_headers or {})}
        return HttpReply(status, headers, json.dumps(body).encode())

    def _record(self, entry: dict[str, Any]) -> None:
        self.log.append(entry)
        if self.log_path is not None:  # 0600, never through a symlink
            append_bytes(self.log_path, canonical_bytes(entry) + b"\n")

    def _fault(self, path: str, request_id: str) -> HttpReply | None:
        f = self.faults
        if path not in f.paths:
            return None
        if f.slow_rate and self._rng.random() < f.slow_rate:
            time.sleep(f.slow_seconds)
        if f.rate and self._rng.random() < f.rate:
            status = self._rng.choice(f.statuses)
            return self._error(status, f"injected fault ({status})", request_id,
                               {"retry-after-ms": str(f.retry_after_ms), "x-should-retry": "true"})
        return None

    # -- entry point -----------------------------------------------------------------------------

    def handle(self, method: str, path: str, headers: Mapping[str, str], raw: bytes) -> HttpReply:
        """Answer one HTTP request. Never raises for bad input: that is a 4xx reply."""
        path = path.split("?", 1)[0]
        method = method.upper()
        with self._lock:
            request_id, msg_id = self._next_ids()
            logged = len(self.log)
            reply = self._answer(method, path, headers, raw, request_id, msg_id)
            if reply.status >= 400 and len(self.log) == logged and self.log_path is not None:
                self._log_refusal(method, path, reply, request_id)
            return reply

    def _log_refusal(self, method: str, path: str, reply: HttpReply, request_id: str) -> None:
        """A line in the log file for a request refused with an error (a 400, 404, 405): its
        status and the error's type and message. `log` (`Emulator.requests`) keeps what was
        billed and the injected faults, as before."""
        try:
            err = json.loads(reply.body)["error"]
        except (ValueError, KeyError, TypeError):
            err = {}
        append_bytes(self.log_path, canonical_bytes({  # type: ignore[arg-type]
            "request_id": request_id, "time": time.time(), "method": method, "path": path[:200],
            "status": reply.status, "error": {"type": err.get("type"), "message": str(err.get("message"))[:500]}})
            + b"\n")

    def _answer(self, method: str, path: str, headers: Mapping[str, str], raw: bytes, request_id: str,
                msg_id: str) -> HttpReply:
        """`handle` without its log line for a refusal; the lock is held."""
        route = _ROUTES.get(path) or ("model" if path.startswith("/v1/models/") else None)
        if route is None:
            return self._error(404, f"Not Found: {path[:200]}", request_id)
        allowed = "GET" if route in ("models", "model") else "POST"
        if method != allowed:
            return self._error(405, f"Method {method[:20]} not allowed on {path[:200]}; use {allowed}", request_id,
                               {"allow": allowed})
        try:
            version_of(headers)  # every request names an API version, before anything else is read
        except MalformedMessageError as err:
            return self._error(400, str(err), request_id)
        if allowed == "GET":
            return self._models(path, request_id)
        fault = self._fault(path, request_id)
        if fault is not None:
            self._record({"request_id": request_id, "path": path, "status": fault.status, "fault": True})
            return fault
        try:
            now = self._clock(headers)
            body, keys = self._decode(raw)
            if route == "count_tokens":
                return self._count_tokens(body, keys, headers, request_id)
            return self._messages(body, keys, headers, now, request_id, msg_id, xxhash.xxh3_64_hexdigest(raw))
        except MalformedMessageError as err:
            if "thinking" in err.problem and ("signature" in err.problem or "latest assistant" in err.problem):
                self.refusals.append({"request_id": request_id, "where": err.where, "message": err.problem})
            return self._error(400, str(err), request_id, code=getattr(err, "code", None))
        except UnknownModelError:
            return self._error(404, f"model: {str(body.get('model'))[:100]}", request_id)

    @staticmethod
    def _clock(headers: Mapping[str, str]) -> float:
        value = headers.get(CLOCK_HEADER)
        if value is None:
            return time.time()
        try:
            t = float(value)
        except ValueError:
            t = math.nan
        if not math.isfinite(t):
            raise MalformedMessageError(CLOCK_HEADER, f"must be a finite number of unix seconds, got {value[:40]!r}")
        return t

    def _decode(self, raw: bytes) -> tuple[dict[str, Any], list[bytes]]:
        """The body, its messages decoded once per distinct message (memo by raw bytes), and each
        message's key. Malformed JSON, lone surrogates and absurd nesting are 400s."""
        try:
            top = _TOP.decode(raw) if raw else None
            if not isinstance(top, dict):
                raise MalformedMessageError("body", "must be a JSON object")
            body: dict[str, Any] = {k: msgspec.json.decode(v) for k, v in top.items() if k != "messages"}
            msgs_raw = _RAW_LIST.decode(top["messages"]) if "messages" in top else None
        except (msgspec.DecodeError, RecursionError) as err:
            raise MalformedMessageError("body", f"There was an error parsing the body of your request: "
                                                f"{_short(err)}") from None
        if msgs_raw is None:
            raise MalformedMessageError("messages", "Field required")
        if not msgs_raw:
            raise MalformedMessageError("messages", "at least one message is required")
        keys: list[bytes] = []
        msgs: list[Any] = []
        infos: list[MessageInfo] = []
        if len(self._msg_memo) > 200_000:
            self._msg_memo.clear()
        for i, r in enumerate(msgs_raw):
            k = xxhash.xxh3_128_digest(r)
            hit = self._msg_memo.get(k)
            if hit is None:
                try:
                    m = msgspec.json.decode(r)
                except (msgspec.DecodeError, RecursionError) as err:
                    raise MalformedMessageError(f"messages[{i}]", f"not valid JSON: {_short(err)}") from None
                hit = self._msg_memo[k] = (m, check_message(m, i))
            keys.append(k)
            msgs.append(hit[0])
            infos.append(hit[1])
        body["messages"] = msgs
        body[_INFOS] = infos
        return body, keys

    def _models(self, path: str, request_id: str) -> HttpReply:
        """``GET /v1/models`` and ``/v1/models/{id}`` from the price table."""
        from ...base.pricing import known_models

        def card(name: str) -> dict[str, Any]:
            info = get_model(name)
            return {"type": "model", "id": name, "display_name": name.replace("-", " ").title(),
                    "created_at": "2026-01-01T00:00:00Z", "max_input_tokens": info.context_window,
                    "max_tokens": info.max_output}

        hdrs = {"content-type": "application/json", "request-id": request_id}
        if path == "/v1/models":
            data = [card(n) for n in known_models()]
            return HttpReply(200, hdrs, json.dumps({"data": data, "has_more": False, "first_id": data[0]["id"],
                                                    "last_id": data[-1]["id"]}).encode())
        name = path[len("/v1/models/"):]
        try:
            return HttpReply(200, hdrs, json.dumps(card(get_model(name).name)).encode())
        except UnknownModelError:
            return self._error(404, f"model: {name[:100]}", request_id)

    def _count_tokens(self, body: dict[str, Any], keys: list[bytes], headers: Mapping[str, str],
                      request_id: str) -> HttpReply:
        info = get_model(str(body.get("model")))
        check_request(body, body.pop(_INFOS), count_only=True)
        check_version(body, version_of(headers))
        betas = _betas(headers)
        cfg = th.config(body, info.name, betas)
        recorded = ondemand.check_blocks(body, betas, self._secret)
        verdict = self.thinking.check(body, info.name, cfg.asked, th.BETA in betas, recorded=recorded) \
            if _has_thinking(body) else th.Verdict()  # "The token counting endpoint runs the same prefix check"
        view = _without(body, verdict)
        req = request_from_body(view, 0.0, self.counter, self._blocks_memo, ratio=info.token_ratio,
                                keys=keys if view is body else None)
        req = self._thinking_tokens(req, view, info.token_ratio)
        total = sum(b.tokens for b in req.blocks)
        headers = {"content-type": "application/json", "request-id": request_id}
        return HttpReply(200, headers, json.dumps({"input_tokens": total}).encode())

    def _messages(self, body: dict[str, Any], keys: list[bytes], headers: Mapping[str, str], now: float,
                  request_id: str, msg_id: str, body_hash: str = "") -> HttpReply:
        if not isinstance(body.get("model"), str) or not body["model"]:
            raise MalformedMessageError("model", "Field required")
        info = get_model(body["model"])
        check_request(body, body.pop(_INFOS), max_output=info.max_output)
        version = version_of(headers)
        check_version(body, version)
        betas = _betas(headers)
        cfg = th.config(body, info.name, betas)
        choice = body.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") in ("tool", "any") and not info.forced_tool_ok:
            raise MalformedMessageError("tool_choice", f"forcing tool use (tool_choice type {choice.get('type')!r}) "
                                                       f"is not supported by {body['model']}; use 'auto' or 'none'")
        od = ondemand.request_of(body, betas, info.name)
        recorded = ondemand.check_blocks(body, betas, self._secret)
        verdict = self.thinking.check(body, info.name, cfg.asked, th.BETA in betas, recorded=recorded) \
            if _has_thinking(body) else th.Verdict()
        if not th.preserved(info.name):
            self._tool_loop_thinking(body, cfg)
        sent = _without(body, verdict)  # what reaches the model: dropped blocks are gone, and not billed
        edit = compact_edit(sent, str(headers.get("anthropic-beta") or ""))
        # what the model sees: from the last compaction block on (everything before it dropped)
        seen = after_last_compaction(sent["messages"])
        view = sent if seen is sent["messages"] else {**sent, "messages": seen}

        def build(v: dict[str, Any], memo_keys: list[bytes] | None = None) -> SimRequest:
            r = request_from_body(v, now, self.counter, self._blocks_memo, ratio=info.token_ratio, keys=memo_keys)
            return self._thinking_tokens(r, v, info.token_ratio)

        req = build(view, keys if view is body else None)
        window = self.context_window or info.context_window
        total = sum(b.tokens for b in req.blocks)
        applied: list[dict[str, Any]] = []
        if "context_management" in body:
            per_block = {}
            for b in req.blocks:
                m = _WHERE.match(b.where)
                if m:
                    per_block[(int(m.group(1)), int(m.group(2)))] = b.tokens
            view, applied = apply_context_management(view, total, per_block, self._clearing)
            if applied:
                req = build(view)
                total = sum(b.tokens for b in req.blocks)
        if total > window:  # the API's exact wording, which clients parse
            return self._error(400, f"prompt is too long: {total} tokens > {window} maximum", request_id)
        if total + body["max_tokens"] > window:
            return self._error(400, f"input length and `max_tokens` exceed context limit: {total} + "
                                    f"{body['max_tokens']} > {window}, decrease input length or "
                                    "`max_tokens` and try again", request_id)
        iterations: list[dict[str, Any]] | None = None
        stop: str | None = None
        if edit is not None and total >= edit.trigger:
            # the summarization step sees the whole prompt and the summary prompt (one more sampling)
            summarize = {**view, "messages": [*view["messages"], summary_prompt(edit)]}
            s_req = build(summarize)
            s_usage = {**self.sim.process(s_req).usage()}
            block = summary_block(view["messages"], edit)
            s_usage["output_tokens"] = output_tokens([{"text": block["content"]}], self.counter, info.token_ratio)
            iterations = [{"type": "compaction", **s_usage}]
            if edit.pause:
                stop = "compaction"
                reply = Reply([block], "compaction")
            else:  # the model answers from the summary: tools, system and the compaction block that
                # starts its response
                view = {**view, "messages": [{"role": "assistant", "content": [block]}]}
                req = build(view)
                total = sum(b.tokens for b in req.blocks)
                answer = self._reply(view)
                reply = Reply([block, *answer.content], answer.stop_reason)
        elif od is not None:  # on demand: the summary alone, no reply, billed as the compaction iteration
            summarize = {**view, "messages": [*view["messages"], summary_prompt(compaction_prompt(od))]}
            s_usage = {**self.sim.process(build(summarize)).usage()}
            prefix = self.thinking.prefixes(body, recorded)[-1].hex()
            block = ondemand.sign_block(self._secret, view["messages"], od, prefix)
            s_usage["output_tokens"] = output_tokens([{"text": block["content"]}], self.counter, info.token_ratio)
            iterations = [{"type": "compaction", **s_usage}]
            stop = "compaction"
            reply = Reply([block], "compaction")
        else:
            reply = self._reply(view)
            block = None
        if stop == "compaction":
            result = None
            usage = {"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                     "output_tokens": 0, "cache_creation": {"ephemeral_5m_input_tokens": 0,
                                                            "ephemeral_1h_input_tokens": 0}}
            out_tokens = 0
        else:
            result = self.sim.process(req)
            content, thought = self._think(reply, cfg, info.name, body, recorded, verdict)
            reply = Reply(content, reply.stop_reason)
            answered = [b for b in reply.content
                        if b.get("type") not in ("compaction", "thinking", "redacted_thinking")]
            out_tokens = output_tokens(answered, self.counter, info.token_ratio) + thought
            stop = reply.stop_reason
            if body["max_tokens"] == 0:
                reply, out_tokens, stop = Reply([]), 0, "max_tokens"
            elif out_tokens > body["max_tokens"]:
                out_tokens, stop = body["max_tokens"], "max_tokens"
            usage = {**result.usage(), "output_tokens": out_tokens}
        if iterations is not None:
            if result is not None:
                iterations.append({"type": "message", **usage})
            usage["iterations"] = iterations  # the top level is the message step's alone
        usage["service_tier"] = "standard"
        message: dict[str, Any] = {
            "id": msg_id, "type": "message", "role": "assistant", "model": body["model"], "content": reply.content,
            "stop_reason": stop, "stop_sequence": None, "usage": usage,
        }
        diag = self._diagnostics(body, req, result, message) if result is not None else None
        if "diagnostics" in body:
            message["diagnostics"] = diag
        if "context_management" in body:
            message["context_management"] = {"applied_edits": applied}
        if th.BETA in betas:  # "Present on every such response ... as [] when there is no entry to report"
            message["input_transformations"] = verdict.transformations()
        cost = info.cost(usage)  # with iterations, their sum
        self._record({
            "request_id": request_id, "message_id": msg_id, "time": now, "model": body["model"], "status": 200,
            "stream": bool(body.get("stream")), "n_messages": len(body["messages"]), "usage": usage,
            "cost_usd": round(cost, 8), "total_input_tokens": result.total_tokens if result else total,
            "hit_block": result.hit_block if result else None,
            "breakpoints": [k for k, _ in result.breakpoints] if result else [],
            "prefix_hashes": result.prefix_hashes if result else [],
            "server_compactions": int(iterations is not None),
            "diagnostics": diag, "internal": INTERNAL_HEADER in headers, "body_hash": body_hash,
            "session": headers.get(SESSION_HEADER),
            "cleared_tool_uses": sum(int(a.get("cleared_tool_uses", 0)) for a in applied),
            "api_version": version,
            # the thinking blocks the request sent back and what the API did with them
            "thinking": {"sent": verdict.kept + len(verdict.dropped), "kept": verdict.kept,
                         "kept_tokens": sum(verdict.tokens.values()), "dropped": len(verdict.dropped),
                         # of the thinking the emulator issued with the turns the request shows: left out, and
                         # what reaches the model valid (reasoning kept = kept_of_issued / issued_tokens)
                         "stripped": verdict.stripped, "issued_tokens": verdict.issued_tokens,
                         "kept_of_issued": verdict.kept_tokens,
                         "dropped_paths": [f"messages.{i}.content.{j}" for i, j, _ in verdict.dropped],
                         # of those, in the latest assistant message (a tool loop's turn, kept whole as the API
                         # requires, whose thinking an earlier edit invalidated: what drop_block is for)
                         "dropped_latest": sum(1 for i, _, _ in verdict.dropped if i == _latest_assistant(body)),
                         "dropped_reasons": sorted({r for _, _, r in verdict.dropped}),
                         "allowed": len(verdict.allowed), "asked": cfg.asked},
        })
        hdrs = {"request-id": request_id}
        if body.get("stream"):
            return HttpReply(200, {**hdrs, "content-type": "text/event-stream", "cache-control": "no-cache"},
                             events=_sse_events(message))
        return HttpReply(200, {**hdrs, "content-type": "application/json"}, json.dumps(message).encode())

    # -- thinking blocks ---------------------------------------------------------------------------

    def _thinking_tokens(self, req: SimRequest, view: dict[str, Any], ratio: float) -> SimRequest:
        """Bill each thinking block sent back as the tokens its model thought (its signature carries
        them: a block whose text was omitted is still billed in full)."""
        msgs = view.get("messages") or []
        fixed = list(req.blocks)
        changed = False
        for k, blk in enumerate(fixed):
            if blk.kind not in ("thinking", "redacted_thinking"):
                continue
            m = _WHERE.match(blk.where)
            if m is None:
                continue
            b = msgs[int(m.group(1))]["content"][int(m.group(2))]
            sig = str(b.get("signature") or b.get("data") or "")
            bound = self.signer.read(sig) or self.signer.foreign(sig)
            if bound is not None and bound.tokens:
                fixed[k] = replace(blk, tokens=max(blk.tokens, round(bound.tokens * ratio)))
                changed = True
        return replace(req, blocks=fixed) if changed else req

    def _think(self, reply: Reply, cfg: th.Config, model: str, body: dict[str, Any], recorded: str | None,
               verdict: th.Verdict) -> tuple[list[dict[str, Any]], int]:
        """The reply with its thinking, each block signed: bound to the model, the prefix it follows
        and the kept block before it; and the tokens the model thought (billed as output). A model
        with preserved thinking thinks before it answers (``display: "omitted"``, the default, sends
        the block with empty text and a signature); ``between_tools`` writes a short progress note
        between tool calls instead."""
        # a replayed redacted block is this model's reasoning too: sent as a thinking block with its text omitted
        content = [{"type": "thinking", "thinking": ""} if b.get("type") == "redacted_thinking" else dict(b)
                   for b in reply.content]
        answer = output_tokens([b for b in content if b.get("type") not in ("thinking", "redacted_thinking")],
                               self.counter)
        hints = list(reply.thinking_tokens or [])
        if th.preserved(model) and cfg.on and reply.thinks is not False:
            has = any(b.get("type") in ("thinking", "redacted_thinking") for b in content)
            if cfg.mode == "between_tools":
                uses = [k for k, b in enumerate(content) if b.get("type") == "tool_use"]
                for k in reversed(uses[1:]):
                    content.insert(k, {"type": "thinking", "thinking": "Next, the following call."})
            elif not has:  # first, or first after the compaction block that starts a server compaction's reply
                content.insert(int(bool(content) and content[0].get("type") == "compaction"),
                               {"type": "thinking", "thinking": ""})
                hints.insert(0, th.thought_tokens(answer))
        pre = self.thinking.prefixes(body, recorded)[-1]
        prev = verdict.last_sig
        if content and content[0].get("type") == "compaction":
            # a server compaction's reply: the checked prefix will start at its block, and the thinking
            # before it is dropped by the server, so the chain starts afresh after the block
            pre, prev = self.thinking.prefixes({**body, "messages": [{"role": "assistant",
                                                                       "content": content[:1]}]})[0], ""
        thought, n = 0, 0
        spent: list[int] = []
        for j, b in enumerate(content):
            if b.get("type") != "thinking":
                continue
            text = str(b.get("thinking", ""))
            if th.preserved(model) and cfg.display == "omitted" and cfg.mode != "between_tools":
                text = ""  # "thinking content is redacted but a signature is returned"
            tokens = hints[n] if n < len(hints) else max(th.thought_tokens(answer) if not text else 0,
                                                         output_tokens([{"text": text}], self.counter))
            n += 1
            binding = th.Binding(model, self.thinking.within(pre, content, j), prev, th.text_id(text), tokens)
            sig = self.signer.sign(binding)
            content[j] = {"type": "thinking", "thinking": text, "signature": sig}
            prev, thought = th.sig_id(sig), thought + tokens
            spent.append(tokens)
        self.thinking.issued(content, spent)
        return content, thought

    @staticmethod
    def _tool_loop_thinking(body: dict[str, Any], cfg: th.Config) -> None:
        """Before preserved thinking (and with ``enabled`` thinking): "a final `assistant` message must
        start with a thinking block" when a tool loop continues and it had one."""
        msgs = body["messages"]
        if cfg.mode not in ("enabled", "adaptive") or len(msgs) < 2:
            return
        last, prev = msgs[-1], msgs[-2]
        pc = prev.get("content")
        if last.get("role") == "user" and prev.get("role") == "assistant" and isinstance(pc, list) and any(
                isinstance(b, dict) and b.get("type") == "tool_use" for b in pc):
            first = pc[0] if pc else {}
            signed = any(isinstance(b, dict) and b.get("type") == "thinking"
                         and str(b.get("signature", "")).startswith(th.Signer.PREFIX) for b in pc)
            if signed and first.get("type") not in ("thinking", "redacted_thinking"):
                raise MalformedMessageError(f"messages[{len(msgs) - 2}].content[0].type",
                                            "Expected `thinking` or `redacted_thinking`, but found "
                                            f"`{first.get('type')}`. When `thinking` is enabled, a final `assistant` "
                                            "message must start with a thinking block")

    def _reply(self, body: dict[str, Any]) -> Reply:
        reply = self.responder.respond(body)
        if not isinstance(reply, Reply):
            raise TypeError(f"responder returned {type(reply).__name__}, expected Reply")
        return reply

    # -- diagnostics -----------------------------------------------------------------------------

    def _diagnostics(self, body: dict[str, Any], req: SimRequest, result: SimResult,
                     message: dict[str, Any]) -> dict[str, Any] | None:
        """Compare with the fingerprint of ``diagnostics.previous_message_id``; store this one."""
        spec = body.get("diagnostics")
        if not isinstance(spec, dict):
            return None
        msgs = body["messages"]
        starts = [i for i, b in enumerate(req.blocks) if b.where.endswith(".content[0]") and b.where.startswith("m")]
        cum = [result.cumulative[s - 1] if s else 0 for s in starts[1:]] + [result.total_tokens]
        fp = _Fingerprint(
            model=canonical_bytes([body["model"], body.get("speed")]),
            tools=canonical_bytes([_block_key(t) for t in body.get("tools") or []]),
            system=canonical_bytes(body.get("system") if isinstance(body.get("system"), str)
                                   else [_block_key(b) for b in body.get("system") or []]),
            params=canonical_bytes([body.get(k) for k in ("tool_choice", "thinking", "context_management",
                                                          "output_config", "output_format")]),
            messages=[_message_key(m) for m in msgs] + [_message_key(message)],
            cum_tokens=cum,
            head_tokens=(result.cumulative[req.n_tools - 1] if req.n_tools else 0,
                         result.cumulative[req.n_tools + req.n_system - 1] if req.n_tools + req.n_system else 0),
        )
        self._fingerprints[message["id"]] = fp
        prev_id = spec.get("previous_message_id")
        if prev_id is None:
            return None
        prev = self._fingerprints.get(str(prev_id))
        if prev is None:
            return {"cache_miss_reason": {"type": "previous_message_not_found"}}
        total = result.total_tokens
        if prev.model != fp.model:
            return _reason("model_changed", total)
        if prev.tools != fp.tools:
            return _reason("tools_changed", total)
        if prev.system != fp.system:
            return _reason("system_changed", total - fp.head_tokens[0])
        if prev.params != fp.params:
            return {"cache_miss_reason": {"type": "unavailable"}}
        cur = fp.messages[:-1]
        n = min(len(prev.messages), len(cur))
        for i in range(n):
            if prev.messages[i] != cur[i]:
                before = fp.cum_tokens[i - 1] if i else fp.head_tokens[1]
                return _reason("messages_changed", total - before)
        if len(cur) < len(prev.messages) - 1:
            return _reason("messages_changed", 0)
        return None


def _betas(headers: Mapping[str, str]) -> set[str]:
    return {b.strip() for b in str(headers.get("anthropic-beta") or "").split(",") if b.strip()}


def _has_thinking(body: dict[str, Any]) -> bool:
    return any(isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking")
               for m in body.get("messages") or [] if isinstance(m, dict) and isinstance(m.get("content"), list)
               for b in m["content"])


def _without(body: dict[str, Any], verdict: th.Verdict) -> dict[str, Any]:
    """The body without the thinking blocks the API dropped. "The API drops each failing block … and
    the request succeeds" (preserved-thinking): an assistant message that held nothing but dropped
    blocks goes with them, so the model sees the turns around it as adjacent (the API combines
    consecutive turns of one role), rather than an empty message it would refuse."""
    if not verdict.dropped:
        return body
    gone: dict[int, set[int]] = {}
    for i, j, _ in verdict.dropped:
        gone.setdefault(i, set()).add(j)
    msgs: list[Any] = []
    for i, m in enumerate(body["messages"]):
        if i in gone:
            m = {**m, "content": [b for j, b in enumerate(m["content"]) if j not in gone[i]]}
            if not m["content"]:
                continue
        msgs.append(m)
    return {**body, "messages": msgs}


def _latest_assistant(body: dict[str, Any]) -> int:
    return max((i for i, m in enumerate(body.get("messages") or []) if isinstance(m, dict)
                and m.get("role") == "assistant"), default=-1)


def compaction_prompt(od: ondemand.OnDemand) -> CompactEdit:
    """The summarization prompt of an on-demand compaction (its ``instructions``, else the default)."""
    return CompactEdit(instructions=od.instructions)


def _reason(kind: str, missed: int) -> dict[str, Any]:
    return {"cache_miss_reason": {"type": kind, "cache_missed_input_tokens": max(0, missed)}}


def _sse_events(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The Messages API stream for a finished message: start, blocks, delta, stop."""
    usage = message["usage"]
    start_usage = {k: v for k, v in usage.items() if k != "output_tokens"} | {"output_tokens": 1}
    head = {k: v for k, v in message.items() if k not in ("content", "usage", "stop_reason")}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": {**head, "content": [], "stop_reason": None,
                                                                 "usage": start_usage}}),
        ("ping", {"type": "ping"}),
    ]
    for i, block in enumerate(message["content"]):
        t = block.get("type")
        if t == "text":
            events.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                   "content_block": {"type": "text", "text": ""}}))
            text = block.get("text", "")
            for k in range(0, max(len(text), 1), 64):
                events.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                       "delta": {"type": "text_delta", "text": text[k:k + 64]}}))
        elif t == "compaction" and block.get("signature") is not None:  # on demand: whole, no delta (§3.5)
            events.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                   "content_block": block}))
        elif t == "compaction":  # one delta with the whole summary (anthropic-cache-facts.md §3.2)
            events.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                   "content_block": {"type": "compaction", "content": None}}))
            events.append(("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {
                "type": "compaction_delta", "content": block.get("content"), "encrypted_content": None}}))
        elif t == "thinking":  # as the API streams it: opened empty, the text in deltas, then its signature
            events.append(("content_block_start", {"type": "content_block_start", "index": i, "content_block": {
                "type": "thinking", "thinking": "", "signature": ""}}))
            text = str(block.get("thinking", ""))
            for k in range(0, len(text), 64):
                delta = {"type": "thinking_delta", "thinking": text[k:k + 64]}
                events.append(("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}))
            events.append(("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {
                "type": "signature_delta", "signature": block.get("signature", "")}}))
        elif t == "tool_use":
            events.append(("content_block_start", {"type": "content_block_start", "index": i, "content_block": {
                "type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}}))
            events.append(("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {
                "type": "input_json_delta", "partial_json": json.dumps(block.get("input", {}))}}))
        else:
            events.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                   "content_block": block}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    delta_usage = {"output_tokens": usage["output_tokens"], "input_tokens": usage["input_tokens"],
                   "cache_creation_input_tokens": usage["cache_creation_input_tokens"],
                   "cache_read_input_tokens": usage["cache_read_input_tokens"]}
    if "iterations" in usage:
        delta_usage["iterations"] = usage["iterations"]
    events.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": message["stop_reason"],
                                                                        "stop_sequence": None},
                                     "usage": delta_usage}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events

