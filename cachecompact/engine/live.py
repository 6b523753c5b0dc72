"""A session as the engine holds it in memory (`Live`), and how one is made (`LiveMaker`): the
session over the store, the strategy built for its model and window with its summarizer, its
forensics and its scratchpad. The registry asks the maker for a new or a stored session and
keeps what it gets; nothing here decides which session a request belongs to."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..base.errors import UnknownModelError
from ..base.events import EventBus
from ..base.pricing import UNKNOWN_MODEL_WINDOW, model_prices, priced
from ..cache.forensics import Forensics
from ..cache.simulator import SimBlock
from ..compaction.scratchpad import READ_SCRATCHPAD_TOOL, Scratchpad
from ..compaction.strategy import Strategy, StrategyConfig, StrategyContext
from ..compaction.summarize.llm import ExtractiveSummarizer, Summarizer
from ..history.session import Session
from ..store import Store
from .options import EngineOptions
from .resolution import head_key

__all__ = ["Live", "LiveMaker", "SummarizerFactory"]

log = logging.getLogger("cachecompact")

SummarizerFactory = Callable[[str | None, str], Summarizer]  # (model or None: the agent's, mode) -> summarizer


@dataclass(slots=True, eq=False)
class Live:
    """A session in memory with what the engine keeps beside it, each field typed and named (no
    bag of keys): the engine writes them, and the registry only hands a new segment its
    parent's forensics."""

    session: Session
    strategy: Strategy
    head: bytes  # `resolution.head_key` of the caller's tools and system the session was made for
    forensics: Forensics  # compares each request with the one before it in this conversation
    scratchpad: Scratchpad | None = None  # the one the levels write to (an in-memory session's folder)
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_message_id: str | None = None  # the last response's id (the diagnostics' previous_message_id)
    requests_seen: int = 0  # request records this process has applied (`CompactionEngine._catch_up`)
    sim_memo: dict[tuple[bytes, int], tuple[list[SimBlock], bool]] = field(default_factory=dict)  # priced blocks

    @property
    def sid(self) -> str:
        return self.session.session_id

    @property
    def identities(self) -> Sequence[bytes]:
        return self.session.transcript.identities


class LiveMaker:
    """Makes the live record of a new or a stored session for one engine's settings."""

    def __init__(self, store: Store | None, options: EngineOptions, strategy_config: StrategyConfig,
                 summarizer: Summarizer | SummarizerFactory | None, events: EventBus,
                 window_tokens: int | None) -> None:
        self.store, self.options, self.strategy_config = store, options, strategy_config
        self._summarizer, self.events, self.window_tokens = summarizer, events, window_tokens

    def summarizer_for(self, model: str | None) -> Summarizer:
        """The summarizer a session on ``model`` gets: the caller's, or one made for the strategy's summary model."""
        s = self._summarizer
        if s is None:
            return ExtractiveSummarizer()
        if isinstance(s, Summarizer):
            return s
        cfg = self.strategy_config
        return s(cfg.summary_model or model, cfg.summary_mode)

    def _live(self, session: Session, body: dict[str, Any], caller_head: bytes) -> Live:
        """The live record: the strategy built for the session's model and window, fresh forensics."""
        model = str(body.get("model") or "")
        own = _model_window(model)
        window = self.window_tokens or own
        if window > own and (model, window) not in _LARGER_WARNED:
            _LARGER_WARNED.add((model, window))  # compaction would wait for room the model does not have
            log.warning("cachecompact: window_tokens=%d is larger than %s's context window (%d tokens); the API "
                        "will refuse requests before compaction starts", window, model or "the model", own)
        ctx = StrategyContext(session=session, summarizer=self.summarizer_for(model or None), events=self.events,
                              window_tokens=window, scratchpad=Scratchpad.for_session(session),
                              scratchpad_tool=self.options.scratchpad_tool)
        return Live(session=session, strategy=self.strategy_config.build(ctx), head=caller_head,
                    forensics=Forensics(priced), scratchpad=ctx.scratchpad)

    def create(self, sid: str, body: dict[str, Any], link: dict[str, Any] | None) -> Live:
        """A new session ``sid`` in the store for the request ``body`` (`SessionExistsError` if taken)."""
        tools = list(body.get("tools") or [])
        if self.options.scratchpad_tool:
            tools.append(READ_SCRATCHPAD_TOOL)
        model = str(body.get("model") or "")
        ratio = priced(model).token_ratio if model else 1.0
        prefix = self.options.prefix_messages if self.options.prefix_messages is not None else \
            self.strategy_config.prefix_messages
        session = Session.create(self.store, session_id=sid, system=body.get("system"), tools=tools,
                                 prefix_messages=prefix, token_ratio=ratio, link=link)
        return self._live(session, body, head_key(body.get("tools"), body.get("system")))

    def open(self, sid: str) -> Live:
        """The stored session ``sid``, live (`SessionNotFoundError` if there is none)."""
        assert self.store is not None
        session = Session.open(self.store, sid)
        tools = session.tools_param
        if self.options.scratchpad_tool and tools and tools[-1].get("name") == READ_SCRATCHPAD_TOOL["name"]:
            tools = tools[:-1]
        body = {"model": (session.last_request or {}).get("model", ""), "tools": tools or None,
                "system": session.system_param}
        return self._live(session, body, head_key(tools or None, session.system_param))


_UNKNOWN_WARNED: set[str] = set()  # models whose window was assumed, said once each
_LARGER_WARNED: set[tuple[str, int]] = set()  # (model, window_tokens) said to exceed the model's window


def _model_window(model: str) -> int:
    """The model's context window from the price table (its family's for a newer id); for a name
    of no known family, `UNKNOWN_MODEL_WINDOW`, said once per name."""
    try:
        return model_prices(model).context_window if model else UNKNOWN_MODEL_WINDOW
    except UnknownModelError:
        if model not in _UNKNOWN_WARNED:
            _UNKNOWN_WARNED.add(model)
            log.warning("cachecompact: model %r is not in the price table; assuming a %d-token context window "
                        "(pass window_tokens=... to set it)", model, UNKNOWN_MODEL_WINDOW)
        return UNKNOWN_MODEL_WINDOW
