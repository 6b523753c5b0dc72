"""``cachecompact forensics TRACE...``: the proxy's cache forensics, offline, on recorded logs.

Claude Code's session logs carry each call's billed usage. Each call is rebuilt as the
simulator sees it (`rebuild_calls`: the messages since Claude Code's last compaction or
microcompact, the unrecorded system prompt and tools as one fitted block, the breakpoint on
the last message, with the TTL the call's usage shows it wrote) and passed with its recorded
usage to the same `Forensics` engine the proxy and the middleware use. Each sub-agent
conversation (Claude Code's Agent tool, logged in ``progress`` or ``isSidechain`` entries) is
a thread of its own: another system prompt, so its own cache entries. What only a log knows
goes with each call: whether a person spoke before it (``client_rewrite`` needs it) and
whether Claude Code compacted since the call before (``client_compaction``); a call whose
time the log lost has none, so no idle gap is read from it. The result says, per class, how
many misses the log holds and what they cost, how many stay unexplained
(``provider_suspected``), what the log cost as billed, its totals per day and project, and
one line of advice per class (docs/cache-model.md, "Forensics on Claude Code logs").
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Callable, Sequence, Set as AbstractSet
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import xxhash

from ..base.errors import TraceFormatError, UnknownModelError
from ..base.pricing import ModelInfo, get_model, model_prices
from ..base.tokens import TokenCounter
from ..base.values import TTL
from ..cache.forensics import CLASSES, Finding, Forensics, snapshot_from_sim
from ..cache.simulator import SimBlock, SimRequest, message_blocks
from .traces.claude_code_logs import IDLE_KIND, load_claude_code
from .traces.trace_model import Trace, parse_time

__all__ = ["LogForensics", "RecordedCall", "RecordedSession", "advice", "billed", "fit_line", "forensics_of_log",
           "rebuild_calls", "recorded_input", "summarize_logs", "written_ttl"]


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares intercept and slope of ys ~ a + b * xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return my, 1.0
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - b * mx, b


@dataclass(slots=True)
class RecordedCall:
    """One API call of a recorded Claude Code session, rebuilt as the simulator sees it."""

    index: int  # the assistant message that answered it
    start: int  # first message of its context (after Claude Code's last compaction)
    recorded: dict[str, int]  # input / write / read as billed
    usage: dict[str, Any]
    estimated: int  # our estimate of the messages' tokens
    request: SimRequest
    human: bool = False  # the last user message is a person's, not only tool results
    compaction: str | None = None  # Claude Code compacted since the previous call ("compact" / "microcompact")
    prompt: str = ""  # the start of the person's newest prompt before it
    time_known: bool = True  # False: the log lost this call's time (``request.time`` carries the last known one)
    message_id: str | None = None  # the API's id of its response


@dataclass(slots=True)
class RecordedSession:
    name: str
    model: str
    prefix: float
    ratio: float
    messages: list[dict[str, Any]]
    calls: list[RecordedCall]


def written_ttl(usage: dict[str, Any]) -> TTL:
    """The TTL a recorded call wrote with: "1h" when its usage reports 1-hour writes only."""
    cc = _counted_step(usage).get("cache_creation")
    if isinstance(cc, dict) and int(cc.get("ephemeral_1h_input_tokens") or 0) > 0 \
            and not int(cc.get("ephemeral_5m_input_tokens") or 0):
        return "1h"
    return "5m"


def recorded_input(usage: dict[str, Any]) -> dict[str, int]:
    """A call's input, write and read as billed (`_counted_step`)."""
    u = _counted_step(usage)
    return {"input": int(u.get("input_tokens") or 0), "write": int(u.get("cache_creation_input_tokens") or 0),
            "read": int(u.get("cache_read_input_tokens") or 0)}


def _counted_step(usage: dict[str, Any]) -> dict[str, Any]:
    """The part of a usage that says what the request read and wrote. The top level is the
    answering message step's (anthropic-cache-facts.md §3.4); a usage that carries its counts
    only in ``iterations`` (issue 50: such a call was billed but never counted) is read from its
    last ``message`` step, the one that read the request's cache, or else its last step."""
    keys = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    its = [it for it in usage.get("iterations") or () if isinstance(it, dict)]
    if any(usage.get(k) for k in keys) or not its:
        return usage
    return next((it for it in reversed(its) if it.get("type") == "message"), its[-1])


def rebuild_calls(path: str | Path | Trace, counter: TokenCounter | None = None) -> RecordedSession | None:
    """Each call of a Claude Code log (or of one thread of it, loaded with
    ``keep_compaction=True``) as a `SimRequest`: the messages since the last compaction, a
    fitted unknown prefix (system + tools) as one block, the fitted tokenizer ratio, and the
    breakpoint Claude Code puts on the last message (see the module docstring). None when the
    log has fewer than 3 usable calls."""
    counter = counter or TokenCounter()
    trace = path if isinstance(path, Trace) else load_claude_code(path, keep_compaction=True)
    model = trace.model or "claude-sonnet-4"
    per_msg = [message_blocks(m, i, counter)[0] for i, m in enumerate(trace.messages)]
    starts = sorted(set(trace.compactions))
    raw_calls: list[tuple[int, int, dict[str, int], dict[str, Any]]] = []
    for i, (m, u) in enumerate(zip(trace.messages, trace.usage, strict=True)):
        if m["role"] != "assistant" or not u or i == 0:
            continue
        s = max((c for c in starts if c <= i - 1), default=0)
        rec = recorded_input(u)
        called = trace.models[i] if i < len(trace.models) else model
        if sum(rec.values()) and i > s and called != "<synthetic>":
            raw_calls.append((i, s, rec, u))
    if len(raw_calls) < 3:
        return None
    est = [sum(b.tokens for blocks in per_msg[s:i] for b in blocks) for i, s, _, _ in raw_calls]
    prefix, ratio = fit_line([float(x) for x in est], [float(sum(r.values())) for _, _, r, _ in raw_calls])
    prefix = max(prefix, 0.0)
    ttls = [written_ttl(u) for _, _, _, u in raw_calls]
    head_ttl: TTL = "1h" if ttls.count("1h") * 2 > len(ttls) else "5m"  # the client's TTL for its system prompt
    head = SimBlock(xxhash.xxh3_128_digest(f"{trace.name}:system+tools".encode()), round(prefix), "text", head_ttl,
                    True, "system (not recorded: system prompt and tools)")
    out = RecordedSession(trace.name, get_model(model).name, prefix, ratio, trace.messages, [])
    last_start = 0
    clock = 0.0  # the last known time: a call the log lost the time of is priced as if no time passed
    for (i, s, rec, u), e, ttl in zip(raw_calls, est, ttls, strict=True):
        blocks = [SimBlock(b.key, max(0, round(b.tokens * ratio)), b.kind, None, b.cacheable, b.where)
                  for blocks_ in per_msg[s:i] for b in blocks_]
        k = len(blocks) - 1
        while k >= 0 and not blocks[k].cacheable:
            k -= 1
        if k >= 0:
            b = blocks[k]
            blocks[k] = SimBlock(b.key, b.tokens, b.kind, ttl if head_ttl == "1h" else "5m", True, b.where)
        known = [x for x in (trace.timestamps[i - 1], trace.timestamps[i]) if x is not None]
        clock = known[0] if known else clock
        call_model = (trace.models[i] if i < len(trace.models) else None) or model
        req = SimRequest(model=call_model, time=clock, blocks=[head, *blocks], n_tools=0, n_system=1)
        compaction = _compaction_kind(trace, s) if s != last_start else None
        last_start = s
        mid = trace.message_ids[i] if i < len(trace.message_ids) else None
        out.calls.append(RecordedCall(i, s, rec, u, e, req, _is_human(trace.messages[i - 1]), compaction,
                                      _prompt_before(trace.messages, i), bool(known), mid))
    return out


def _prompt_before(messages: list[dict[str, Any]], i: int, width: int = 80) -> str:
    """The start of the newest person's words before message ``i``, on one line."""
    for m in reversed(messages[:i]):
        if not _is_human(m):
            continue
        c = m["content"]
        text = c if isinstance(c, str) else " ".join(str(b.get("text") or "") for b in c
                                                     if isinstance(b, dict) and b.get("type") == "text")
        text = " ".join(text.split())
        if text:
            return text if len(text) <= width else text[: width - 3] + "..."
    return ""


def _is_human(m: dict[str, Any]) -> bool:
    """Whether a user message holds a person's words (anything but tool results)."""
    c = m.get("content")
    return m.get("role") == "user" and (isinstance(c, str) or any(
        isinstance(b, dict) and b.get("type") != "tool_result" for b in c or ()))


def _compaction_kind(trace: Trace, start: int) -> str:
    """What made the cut where a call's context starts: the loader's record of it (a
    microcompact, or a compaction and its summary)."""
    if trace.compaction_kinds and start in trace.compactions:
        return trace.compaction_kinds[trace.compactions.index(start)]
    return "compact"




@dataclass
class LogForensics:
    """Findings of one log: its main chain's calls, then each sub-agent's (``threads`` counts
    the conversations that had enough calls to judge), with what the log cost as billed."""

    name: str
    calls: int
    findings: list[Finding] = field(default_factory=list)
    threads: int = 1
    subagent_calls: int = 0
    project: str = ""  # the folder the log is in (Claude Code: one per project directory)
    model: str = ""
    first: float | None = None  # the first and last recorded times
    last: float | None = None
    cost_usd: float = 0.0  # every recorded call, sub-agents included, at the prices of the log's day
    subagent_cost_usd: float = 0.0  # the sub-agents' part of it (whatif replays main chains only)
    extra_1h_usd: float = 0.0  # what its 5-minute writes would have cost more with the 1-hour TTL
    resumes: list[str] = field(default_factory=list)  # earlier logs whose history it copies (a resumed session)

    @property
    def misses(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.findings:
            if f.cls != "read_as_expected":
                out[f.cls] = out.get(f.cls, 0) + 1
        return out

    @property
    def wasted(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for f in self.findings:
            if f.cls != "read_as_expected":
                out[f.cls] = out.get(f.cls, 0.0) + f.wasted_usd
        return out

    @property
    def day(self) -> str:
        """The UTC date of the log's first recorded time ("unknown" without one)."""
        return datetime.fromtimestamp(self.first, UTC).date().isoformat() if self.first is not None else "unknown"


def forensics_of_log(path: str | Path, counter: TokenCounter | None = None,
                     seen: dict[str, str] | None = None) -> LogForensics | None:
    """Findings for every call of one Claude Code log; None when it has too few calls with usage.
    ``seen`` maps the response ids earlier logs counted to those logs' names: a resumed session's
    log copies its original's history, whose calls are then analysed (the ones after them are
    compared with them) but neither counted nor billed twice, and the log names what it resumes;
    it is updated with this log's. Raises `TraceFormatError` for a file that is not such a log."""
    counter = counter or TokenCounter()
    seen = {} if seen is None else seen
    trace = load_claude_code(path, keep_compaction=True, repair_times=True)
    rs = rebuild_calls(trace, counter)
    if rs is None:
        return None
    times = [t for th in (trace, *trace.subagents) for t in th.timestamps if t is not None]
    out = LogForensics(rs.name, 0, threads=0, project=Path(path).parent.name, model=rs.model,
                       first=min(times, default=None), last=max(times, default=None))

    def prices(model: str) -> ModelInfo:  # the prices of the day the log was recorded
        return model_prices(model).as_of(out.first)

    mine: set[str] = set()
    main_usd, main_extra = billed((trace,), prices, rs.model, seen.keys(), mine)
    out.subagent_cost_usd, sub_extra = billed(trace.subagents, prices, rs.model, seen.keys(), mine)
    copied = {seen[m] for th in (trace, *trace.subagents) for m in th.message_ids if m is not None and m in seen}
    out.resumes = sorted(copied)
    out.cost_usd, out.extra_1h_usd = main_usd + out.subagent_cost_usd, main_extra + sub_extra
    subs = [t for t in (rebuild_calls(sub, counter) for sub in trace.subagents) if t is not None]
    for n, thread in enumerate([rs, *subs]):  # numbered as listed: a sub-agent too short to judge is none
        label = None if n == 0 else f"sub-agent {n} ({thread.name.rsplit('.', 1)[-1]})"
        engine = Forensics(as_of=out.first)  # a thread's cache entries are its own (another system prompt)
        body = {"messages": thread.messages}
        floor = min((c.recorded["read"] for c in thread.calls if c.recorded["read"]), default=0)
        counted = 0
        for c in thread.calls:
            snap = snapshot_from_sim(c.request, body)
            snap.from_log, snap.human_turn, snap.client_compaction = True, c.human, c.compaction
            snap.prompt, snap.head_floor = c.prompt, floor
            if not c.time_known:
                snap.time = math.nan  # the log lost it: no idle gap is read
            f = engine.observe(snap, {**c.usage, **_counted_step(c.usage)})
            f.thread = label
            if c.message_id is not None and c.message_id in seen:
                continue  # an earlier log's call, copied into this one
            out.findings.append(f)
            counted += 1
        out.calls += counted
        out.threads += 1
        if thread is not rs:
            out.subagent_calls += counted
    seen.update(dict.fromkeys(mine, rs.name))
    return out


def billed(threads: Sequence[Trace], prices: Callable[[str], ModelInfo], model: str,
           seen: AbstractSet[str] = frozenset(), mine: set[str] | None = None) -> tuple[float, float]:
    """What the threads' recorded calls cost as billed, and what their 5-minute writes would have
    cost more at the 1-hour price. A response whose id is in ``seen`` (an earlier log's) or was
    met already (a microcompact's copy) is billed once; ``mine`` collects the ids billed here.
    ``model`` prices a call that recorded none; "<synthetic>" entries cost nothing."""
    mine = set() if mine is None else mine
    cost = extra = 0.0
    for th in threads:
        for k, usage in enumerate(th.usage):
            mid = th.message_ids[k] if k < len(th.message_ids) else None
            if not usage or (mid is not None and (mid in seen or mid in mine)):
                continue
            if mid is not None:
                mine.add(mid)
            try:
                p = prices((th.models[k] if k < len(th.models) else None) or model)
            except UnknownModelError:
                continue
            cost += p.cost(usage)
            step = _counted_step(usage)  # a usage with its counts only in iterations too
            cc = step.get("cache_creation") if isinstance(step.get("cache_creation"), dict) else None
            w5m = int((cc or {}).get("ephemeral_5m_input_tokens") or 0) if cc else \
                int(step.get("cache_creation_input_tokens") or 0)
            extra += w5m * (p.write_1h - p.write_5m) / 1e6
    return cost, extra


def _misses() -> dict[str, Any]:
    return {c: 0 for c in CLASSES if c != "read_as_expected"}


def _group(done: Sequence[LogForensics], key: Callable[[LogForensics], str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in sorted(done, key=key):
        g = out.setdefault(key(r), {"logs": 0, "calls": 0, "cost_usd": 0.0, "wasted_usd": 0.0})
        g["logs"] += 1
        g["calls"] += r.calls
        g["cost_usd"] += r.cost_usd
        g["wasted_usd"] += sum(r.wasted.values())
    return out


def summarize_logs(paths: Sequence[str | Path]) -> tuple[list[LogForensics], list[dict[str, str]], dict[str, Any]]:
    """Run every log; returns the per-log results, the skipped files with reasons, and totals:
    per class (misses, dollars), per day and per project (calls, cost, waste), and one line
    of advice per class that cost anything (`advice`)."""
    counter = TokenCounter()
    done: list[LogForensics] = []
    skipped: list[dict[str, str]] = []
    # oldest log first: a resumed session's log copies its original's responses, and the one that
    # counts them is the original (issue 50 review: by file name, a UUID, the copy could come first)
    paths = sorted(paths, key=_first_time)
    seen: dict[str, str] = {}  # response ids counted, and by which log: a resumed session's copies count once
    for p in paths:
        before = dict(seen)
        try:
            r = forensics_of_log(p, counter, seen)
        except TraceFormatError as err:
            skipped.append({"file": str(p), "reason": err.reason})
            continue
        except Exception as err:  # one file's problem is never the whole run's: said, and skipped
            seen.clear()
            seen.update(before)  # nothing of a file that failed counts
            skipped.append({"file": str(p), "reason": f"could not be analysed ({type(err).__name__}: "
                                                      f"{' '.join(str(err).split())[:160]}); a bug, please report it"})
            continue
        if r is None:
            skipped.append({"file": str(p), "reason": "fewer than 3 calls with recorded usage"})
            continue
        done.append(r)
    totals: dict[str, Any] = {"logs": len(done), "calls": sum(r.calls for r in done),
                              "subagent_calls": sum(r.subagent_calls for r in done),
                              "cost_usd": sum(r.cost_usd for r in done),
                              "subagent_cost_usd": sum(r.subagent_cost_usd for r in done),
                              "misses": _misses(), "wasted_usd": {c: 0.0 for c in _misses()}}
    for r in done:
        for k, v in r.misses.items():
            totals["misses"][k] += v
        for k, w in r.wasted.items():
            totals["wasted_usd"][k] += w
    totals["explained"] = sum(v for k, v in totals["misses"].items() if k != "provider_suspected")
    totals["unexplained"] = totals["misses"]["provider_suspected"]
    totals["by_day"] = _group(done, lambda r: r.day)
    totals["by_project"] = _group(done, lambda r: r.project)
    totals["advice"] = advice(done, totals)
    return done, skipped, totals


def _first_time(path: str | Path) -> float:
    """The first time a log records (its first line with a timestamp); unreadable, timeless or not a
    regular file: last. Opened without blocking and checked on the open file, so a FIFO named as a
    log never stalls the sort (`read_text` then refuses it with its reason)."""
    try:
        fd = os.open(str(path), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError:
        return math.inf
    try:
        with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return math.inf
            for k, line in enumerate(f):
                if k > 200:
                    break
                if '"timestamp"' not in line:
                    continue
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                t = parse_time(e.get("timestamp")) if isinstance(e, dict) else None
                if t is not None:
                    return t
    except OSError:
        pass
    return math.inf


def advice(done: Sequence[LogForensics], totals: dict[str, Any]) -> list[str]:
    """One line per class that cost anything: what it was, and what would have avoided it."""
    n, usd = totals["misses"], totals["wasted_usd"]
    out: list[str] = []
    if n["ttl_expiry"]:
        within = sum(f.wasted_usd for r in done for f in r.findings
                     if f.cls == "ttl_expiry" and f.idle_s is not None and f.idle_s <= 3600)
        beyond = usd["ttl_expiry"] - within
        extra = sum(r.extra_1h_usd for r in done)
        five = sum(1 for r in done if r.extra_1h_usd > 0)  # logs that wrote with the 5-minute TTL at all
        if within > 0 and not five:
            # every write was already a 1-hour one (issue 50: told to "keep the 5-minute TTL"): no TTL choice helps
            out.append(f"ttl_expiry: {n['ttl_expiry']} misses cost ${usd['ttl_expiry']:.2f}, though these logs already "
                       "write with the 1-hour TTL: entries went before their hour was up (an eviction, or a cache on "
                       "another replica); only compacting before the pause, or a shorter pause, avoids them")
        elif within > 0:
            bound = extra + beyond  # 1 h at its worst: every 5-minute write dearer, gaps over an hour missed anyway
            said = (f"ttl_expiry: idle gaps over 5 min ({n['ttl_expiry']} misses) cost ${usd['ttl_expiry']:.2f}; the "
                    f"1-hour TTL would have cost at most ${bound:.2f} instead (every 5-minute write at the 1-hour "
                    f"price: +${extra:.2f}; gaps over an hour, missed anyway: ${beyond:.2f}). ")
            if bound < usd["ttl_expiry"]:
                said += (f"Switch to the 1-hour TTL: it saves at least ${usd['ttl_expiry'] - bound:.2f} on these logs "
                         "(Claude Code on an API key: ENABLE_PROMPT_CACHING_1H=1 or the promptCacheTtl setting; "
                         "cachecompact chooses per request unless ttl= is fixed)")
            else:
                said += (f"Keep the 5-minute TTL{'' if five == len(done) else f' on the {five} logs that use it'}: "
                         f"on these logs the 1-hour one could cost up to ${bound - usd['ttl_expiry']:.2f} more than "
                         "the misses it avoids")
            out.append(said)
        else:
            out.append(f"ttl_expiry: {n['ttl_expiry']} misses after gaps over an hour cost "
                       f"${usd['ttl_expiry']:.2f}; no TTL keeps a cache that long, so keep the TTL you have: only a "
                       "shorter pause, or compacting before the cache expires, avoids them")
    lines = {
        "client_rewrite": "a person's turn re-wrote the whole conversation {k} times (${u:.2f}): Claude Code changed "
                          "messages its log does not record; prefer continuing a session to --resume",
        "client_compaction": "Claude Code's own compactions re-wrote the context {k} times (${u:.2f}); compacting "
                             "with the cache in mind (cachecompact proxy --mode compact) keeps the prefix",
        "prefix_churn": "an earlier block changed {k} times (${u:.2f}): keep the system prompt and tools fixed "
                        "within a session (no timestamps or ids in them)",
        "invalidation": "a model or parameter switch invalidated the cache {k} times (${u:.2f}): keep one model, "
                        "tool_choice and thinking setting per session",
        "lookback_miss": "the cached end fell behind every breakpoint's 20-block lookback {k} times (${u:.2f}): "
                         "put a breakpoint nearer the new end",
        "below_minimum": "{k} requests were shorter than the model's minimum cacheable length (${u:.2f})",
        "server_edit": "the API's own context editing (context_management) re-wrote the cache {k} times (${u:.2f})",
        "provider_suspected": "{k} misses (${u:.2f}) that nothing in the log explains: -v lists them with their "
                              "times, to match with the provider's records",
    }
    idle = [f for r in done for f in r.findings
            if f.cls == "client_compaction" and f"own {IDLE_KIND} " in (f.detail or "")]
    for cls, text in lines.items():
        if n.get(cls):
            out.append(f"{cls}: " + text.format(k=n[cls], u=usd[cls]))
        if cls == "client_compaction" and idle:  # right under its class's line
            cost = sum(f.wasted_usd for f in idle)
            out.append(f"  of which {len(idle)} after Claude Code's idle compaction (${cost:.2f}): what it left "
                       "was written at the next request, when the person came back; Claude Code's setting "
                       "idleCompaction turns it off")
    return out
