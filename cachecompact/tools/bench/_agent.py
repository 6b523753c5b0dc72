"""The replayed agent, closed loop: it acts on what each request shows (issue 47).

An open-loop replay answers every request with the recorded next reply, whatever the request
showed, and only charges a notional re-read turn when the evidence a recorded call needs was
hidden. A live agent does not go on blind: it runs the tool again. `ClosedLoopAgent` is the
model of the replay, deciding on the body the emulator hands it (after the strategy's render
and any server-side edit), as a model would:

* the recorded next call's references (`_recall.evidence_table`: identifiers its inputs use
  that earlier tool results showed) are looked for in the request; where one is hidden, the
  agent answers with a **re-run** of the call that produced it (same tool and input, a fresh
  id) instead of the recorded call, and the harness answers the re-run with the recorded
  result, through the strategy under test;
* only once the evidence is visible, or the agent gives up on it, does the recorded call go
  out; a re-run whose result comes back hidden again is a **loop**;
* a source is re-run at most `ATTEMPTS` times for one recorded call (then the reference is
  *lost*: charged one notional re-read turn in the adjusted cost, as the open loop charges);
  past `LOOP_CAP` loops in a session the agent is **stuck**, and the session does not complete.

Every strategy, ours and the peers', runs under this same agent. What cannot be re-run stays
lost: a sub-agent's result (a whole conversation), a person's answer, a result the trace never
recorded. Evidence recall is measured at first sight (before any re-run), so it stays
comparable with the open loop; re-runs and loops are what the hidden evidence cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..emulator.responders import ReplayResponder, Reply
from ._recall import Evidence, evidence_table, prefix_intact, request_text, visible

__all__ = ["ATTEMPTS", "LOOP_CAP", "NOT_RERUNNABLE", "ClosedLoopAgent"]

ATTEMPTS = 2  # re-runs of one source for one recorded call, the second of which is a loop's retry
LOOP_CAP = 16  # loops in a session past which the agent is stuck (the session does not complete)
# tools whose result a re-run cannot give again: a sub-agent's whole conversation, a person's answer
NOT_RERUNNABLE = frozenset({"Task", "Agent", "AskUserQuestion", "ExitPlanMode"})
MISSING = "[no tool result was recorded for this call]"  # traces._repair's placeholder


def _result_text(block: dict[str, Any]) -> str:
    c = block.get("content")
    if isinstance(c, str):
        return c
    return "\n".join(str(x.get("text", "")) for x in c or [] if isinstance(x, dict))


@dataclass
class ClosedLoopAgent:
    """A responder over `ReplayResponder` that re-runs what it cannot see (module docstring)."""

    inner: ReplayResponder
    attempts: int = ATTEMPTS
    loop_cap: int = LOOP_CAP
    references: int = 0
    recalled: int = 0  # visible at first sight
    named: int = 0  # the identifier anywhere in the request, at first sight
    recalled_final: int = 0  # visible when the recorded call went out
    reruns: int = 0  # re-run tool calls made
    loops: int = 0  # re-runs whose result came back hidden (once per source and request)
    stuck: bool = False
    # (agent request ordinal, tokens of the tool result) of each reference lost: never made visible
    lost: list[tuple[int, int]] = field(default_factory=list)
    requests: int = 0  # agent requests answered
    prefix_kept: int = 0  # of them, those that showed the caller's first messages as sent (`_recall.prefix_intact`)
    # the history the caller sends (the harness's); not the trace's, whose thinking the emulator signs anew
    caller: list[dict[str, Any]] | None = None
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)  # re-run id -> its result block
    _table: dict[int, list[Evidence]] | None = None
    _uses: dict[str, dict[str, Any]] = field(default_factory=dict)  # tool_use id -> the call
    _results: dict[str, dict[str, Any]] = field(default_factory=dict)  # tool_use id -> its result
    _tried: dict[int, dict[str, int]] = field(default_factory=dict)  # recorded index -> {source: re-runs}
    _n: int = 0

    def _index(self) -> dict[int, list[Evidence]]:
        if self._table is None:
            msgs = list(self.inner.messages)
            self._table = evidence_table(msgs)
            for m in msgs:
                content = m.get("content")
                for b in content if isinstance(content, list) else ():
                    if isinstance(b, dict) and b.get("type") == "tool_use":
                        self._uses.setdefault(str(b.get("id")), b)
                    elif isinstance(b, dict) and b.get("type") == "tool_result":
                        self._results.setdefault(str(b.get("tool_use_id")), b)
        return self._table

    def _rerunnable(self, source_id: str) -> bool:
        use, res = self._uses.get(source_id), self._results.get(source_id)
        return use is not None and res is not None and use.get("name") not in NOT_RERUNNABLE \
            and _result_text(res) != MISSING

    def respond(self, body: dict[str, Any]) -> Reply:
        idx = self.inner.select(body)
        refs = self._index().get(idx, []) if idx is not None else []
        self.requests += 1
        if self.caller is not None:
            self.prefix_kept += prefix_intact(body, self.caller)
        if not refs:
            return self.inner.answer(idx)
        sent = "\n" + request_text(body) + "\n"
        first = idx not in self._tried
        assert idx is not None
        tried = self._tried.setdefault(idx, {})
        hidden = [ev for ev in refs if not visible(ev, sent)]
        if first:
            self.references += len(refs)
            self.recalled += len(refs) - len(hidden)
            self.named += sum(ev.identifier in sent for ev in refs)
        again = {ev.source_id for ev in hidden if ev.source_id in tried}
        self.loops += len(again)  # re-run, and still hidden
        if self.loops > self.loop_cap:
            self.stuck = True
        want = None
        for ev in sorted(hidden, key=lambda e: -e.source):  # the newest source first, one per turn
            if not self.stuck and self._rerunnable(ev.source_id) and tried.get(ev.source_id, 0) < self.attempts:
                want = ev.source_id
                break
        if want is not None:
            tried[want] = tried.get(want, 0) + 1
            self._n += 1
            rid = f"toolu_rerun_{self._n:05d}"  # unique in the session: never a recorded id
            use = self._uses[want]
            result = {k: v for k, v in self._results[want].items() if k != "cache_control"}
            self.pending[rid] = {**result, "tool_use_id": rid}
            self.reruns += 1
            return Reply([{"type": "tool_use", "id": rid, "name": use["name"], "input": use.get("input", {})}],
                         "tool_use")
        self.recalled_final += len(refs) - len(hidden)
        charged: set[str] = set()
        for ev in hidden:  # given up on: what a notional re-read turn would have cost, once per source
            if ev.source_id not in charged:
                charged.add(ev.source_id)
                self.lost.append((self.requests - 1, ev.source_tokens))
        return self.inner.answer(idx)

    @property
    def recall(self) -> float:
        return self.recalled / self.references if self.references else 1.0

    @property
    def name_recall(self) -> float:
        return self.named / self.references if self.references else 1.0

    @property
    def final_recall(self) -> float:
        return self.recalled_final / self.references if self.references else 1.0
