"""The cache simulator against the documented rules and worked examples (pure, no HTTP)."""

from __future__ import annotations

from datetime import UTC
from pathlib import Path

import pytest
import xxhash

from cachecompact import Session
from cachecompact.base.errors import MalformedMessageError
from cachecompact.base.pricing import ModelInfo, get_model, override, register_model
from cachecompact.base.tokens import TokenCounter
from cachecompact.cache.simulator import CacheSimulator, SimBlock, SimRequest, positions, request_from_body

from ..conftest import SYSTEM, TOOLS, history

MODEL = "claude-sonnet-4-6"  # minimum cacheable prompt: 1024 tokens
SMALL = "claude-opus-5"  # minimum 512, so a 5-block (1000-token) prefix can be cached


def blk(i: int, tokens: int = 200, ttl: str | None = None, kind: str = "text", cacheable: bool = True) -> SimBlock:
    return SimBlock(xxhash.xxh3_128_digest(f"block-{i}".encode()), tokens, kind, ttl, cacheable)


def req(n: int, bps: dict[int, str], t: float = 0.0, model: str = MODEL, salt: bytes = b"", **kw: object) -> SimRequest:
    """n blocks numbered 1..n (as in the docs), breakpoints at the given 1-based numbers."""
    blocks = [blk(i, ttl=bps.get(i)) for i in range(1, n + 1)]
    return SimRequest(model=model, time=t, blocks=blocks, messages_salt=salt, **kw)  # type: ignore[arg-type]


def sim() -> CacheSimulator:
    return CacheSimulator(lambda m: get_model(m).min_cacheable)


def test_docs_lookback_example_10_15_35() -> None:
    s = sim()
    r1 = s.process(req(10, {10: "5m"}, t=0))
    assert (r1.cache_read_input_tokens, r1.cache_creation_input_tokens) == (0, 2000)
    r2 = s.process(req(15, {15: "5m"}, t=10))  # hits the entry @10, processes 11-15, writes @15
    assert r2.cache_read_input_tokens == 2000 and r2.cache_creation_input_tokens == 1000
    assert r2.hit_block == 9
    r3 = s.process(req(35, {35: "5m"}, t=20))  # checks 35..16: @15 is one position outside
    assert r3.cache_read_input_tokens == 0 and r3.cache_creation_input_tokens == 7000


def test_docs_lookback_example_second_breakpoint_finds_it() -> None:
    s = sim()
    s.process(req(10, {10: "5m"}, t=0))
    s.process(req(15, {15: "5m"}, t=10))
    r3 = s.process(req(35, {15: "5m", 35: "5m"}, t=20))
    assert r3.cache_read_input_tokens == 3000 and r3.cache_creation_input_tokens == 4000


def test_writes_happen_only_at_breakpoints() -> None:
    s = sim()
    s.process(req(12, {10: "5m"}))
    r = s.process(req(12, {9: "5m", 12: "5m"}, t=1))  # nothing was written @9 or @11
    assert r.hit_block == 9  # 0-based index of block 10, found from the @12 lookback
    s2 = sim()
    s2.process(req(12, {10: "5m"}))
    r2 = s2.process(req(12, {9: "5m"}, t=1))
    assert r2.cache_read_input_tokens == 0  # @9 looks back from 9: the entry @10 is later, not earlier


def test_tool_runs_count_as_one_position() -> None:
    kinds = ["text", "tool_use", "tool_use", "tool_use", "tool_result", "tool_result", "text"]
    assert positions(kinds) == [0, 1, 1, 1, 2, 2, 3]
    s = sim()
    base = [blk(i) for i in range(10)]
    s.process(SimRequest(MODEL, 0, [*base[:-1], blk(9, ttl="5m")]))
    # 30 more blocks, but 24 of them are 2 runs of tool_use/tool_result: 8 positions in all
    more = [blk(100 + i, 10, kind="tool_use") for i in range(12)]
    more += [blk(200 + i, 10, kind="tool_result") for i in range(12)]
    more += [blk(300 + i, 10) for i in range(5)] + [blk(400, 10, ttl="5m")]
    r = s.process(SimRequest(MODEL, 1, base + more))
    assert r.hit_block == 9 and r.cache_read_input_tokens == 2000
    # the same number of blocks as separate positions is out of reach
    s2 = sim()
    s2.process(SimRequest(MODEL, 0, [*base[:-1], blk(9, ttl="5m")]))
    flat = [blk(500 + i, 10) for i in range(29)] + [blk(600, 10, ttl="5m")]
    assert s2.process(SimRequest(MODEL, 1, base + flat)).cache_read_input_tokens == 0


def test_more_than_four_breakpoints_is_the_apis_400() -> None:
    with pytest.raises(MalformedMessageError, match=r"4 blocks with cache_control may be provided\. Found 5"):
        sim().process(req(12, {2: "5m", 4: "5m", 6: "5m", 8: "5m", 10: "5m"}))


def test_nothing_cached_below_the_minimum() -> None:
    s = sim()
    r = s.process(req(5, {5: "5m"}))  # 1000 tokens < 1024
    assert (r.cache_creation_input_tokens, r.cache_read_input_tokens, r.input_tokens) == (0, 0, 1000)
    r = s.process(req(5, {5: "5m"}, t=1))
    assert r.cache_read_input_tokens == 0
    # a short breakpoint is billed as input; a later long one is written
    s2 = sim()
    r = s2.process(req(8, {3: "5m", 8: "5m"}))
    assert r.cache_creation_input_tokens == 1600 and r.input_tokens == 0
    assert s2.process(req(8, {3: "5m"}, t=1)).cache_read_input_tokens == 0
    assert get_model("claude-haiku-4-5").min_cacheable == 4096 and get_model("claude-opus-5").min_cacheable == 512


def test_ttl_counts_from_request_start_and_read_refreshes() -> None:
    s = sim()
    s.process(req(10, {10: "5m"}, t=1000))
    assert s.process(req(10, {10: "5m"}, t=1299)).cache_read_input_tokens == 2000  # refreshed at 1299
    assert s.process(req(10, {10: "5m"}, t=1598)).cache_read_input_tokens == 2000  # 299 s after the refresh
    assert s.process(req(10, {10: "5m"}, t=1899)).cache_read_input_tokens == 0  # 301 s: expired, rewritten
    s1h = sim()
    s1h.process(req(10, {10: "1h"}, t=0))
    r = s1h.process(req(10, {10: "1h"}, t=3000))
    assert r.cache_read_input_tokens == 2000
    assert s1h.process(req(10, {10: "1h"}, t=3000 + 3601)).cache_read_input_tokens == 0


def test_mixed_ttls_follow_the_abc_rule() -> None:
    s = sim()
    r = s.process(req(20, {5: "1h", 20: "5m"}, t=0, model=SMALL))
    # A = 0, B = 1000 (1h @5), C = 4000 (@20)
    assert (r.ephemeral_1h_input_tokens, r.ephemeral_5m_input_tokens, r.cache_read_input_tokens) == (1000, 3000, 0)
    r = s.process(req(25, {5: "1h", 20: "5m", 25: "5m"}, t=60, model=SMALL))
    assert (r.cache_read_input_tokens, r.ephemeral_1h_input_tokens, r.ephemeral_5m_input_tokens) == (4000, 0, 1000)
    r = s.process(req(25, {5: "1h", 25: "5m"}, t=60 + 600, model=SMALL))  # 5m entries expired, the 1h one lives
    assert (r.cache_read_input_tokens, r.ephemeral_1h_input_tokens, r.ephemeral_5m_input_tokens) == (1000, 0, 4000)
    assert r.input_tokens == 0
    with pytest.raises(MalformedMessageError, match="1h"):
        sim().process(req(20, {5: "5m", 20: "1h"}))


def test_automatic_caching_uses_last_cacheable_block() -> None:
    s = sim()
    blocks = [blk(i) for i in range(9)] + [blk(9, kind="thinking", cacheable=False)]
    r = s.process(SimRequest(MODEL, 0, blocks, auto_ttl="5m"))
    assert r.breakpoints == [(8, "5m")] and r.cache_creation_input_tokens == 1800
    same = [*blocks[:8], blk(8, ttl="5m"), blocks[9]]
    assert s.process(SimRequest(MODEL, 1, same, auto_ttl="5m")).breakpoints == [(8, "5m")]
    with pytest.raises(MalformedMessageError, match="ttl differs"):
        s.process(SimRequest(MODEL, 2, same, auto_ttl="1h"))
    four = [blk(i, ttl="5m" if i in (1, 3, 5, 7) else None) for i in range(10)]
    with pytest.raises(MalformedMessageError, match="free breakpoint"):
        s.process(SimRequest(MODEL, 3, four, auto_ttl="5m"))


def test_invalidation_levels_and_per_model_cache() -> None:
    tools_sys = dict(n_tools=2, n_system=3)  # blocks 1-2 tools, 3-5 system, 6.. messages
    s = sim()
    s.process(req(12, {5: "5m", 12: "5m"}, model=SMALL, **tools_sys))  # type: ignore[arg-type]
    r = s.process(req(12, {5: "5m", 12: "5m"}, t=1, model=SMALL, salt=b"tool_choice=any",
                      **tools_sys))  # type: ignore[arg-type]
    assert r.cache_read_input_tokens == 1000  # tools + system still hit; messages rewritten
    assert r.cache_creation_input_tokens == 1400
    other = s.process(req(12, {5: "5m", 12: "5m"}, t=2, model="claude-fable-5", **tools_sys))  # type: ignore[arg-type]
    assert other.cache_read_input_tokens == 0


def test_request_from_body_matches_renderer_tokens_and_salts() -> None:
    s = Session.create(None, system=SYSTEM, tools=TOOLS)
    s.sync(history(5))
    r = s.render(model=MODEL)
    counter = TokenCounter()
    sr = request_from_body(r.body, 0.0, counter)
    assert sum(b.tokens for b in sr.blocks) == r.raw_tokens
    assert [b.key for b in sr.blocks] == [b.key for b in r.blocks()]
    assert [k for k, b in enumerate(sr.blocks) if b.ttl] == r.breakpoints
    other = request_from_body({**r.body, "tool_choice": {"type": "any"}}, 0.0, counter)
    assert other.messages_salt != sr.messages_salt and other.system_salt == sr.system_salt
    img = dict(r.body)
    img["messages"] = [*r.body["messages"][:-1], {"role": "user", "content": [
        *r.body["messages"][-1]["content"], {"type": "image", "source": {"type": "url", "url": "u"}}]}]
    assert request_from_body(img, 0.0, counter).messages_salt != sr.messages_salt


def test_pricing_costs_and_overrides() -> None:
    usage = {"input_tokens": 1_000_000, "cache_creation_input_tokens": 1_000_000, "cache_read_input_tokens": 1_000_000,
             "output_tokens": 1_000_000, "cache_creation": {"ephemeral_5m_input_tokens": 500_000,
                                                            "ephemeral_1h_input_tokens": 500_000}}
    m = get_model("claude-sonnet-4-20250514")
    assert m.name == "claude-sonnet-4"
    assert m.cost(usage) == pytest.approx(3 + 0.5 * 3.75 + 0.5 * 6 + 0.3 + 15)
    assert get_model("claude-3-5-haiku-latest").name == "claude-haiku-3-5"
    assert get_model("claude-fable-5-1").read == 0.25
    register_model(ModelInfo("my-proxy-model", 1, 1.25, 2, 0.1, 5, 100, 50_000, 1000, "sonnet", 1.0, True, "mine"))
    assert get_model("my-proxy-model").context_window == 50_000
    override("my-proxy-model", read=0.05)
    assert get_model("my-proxy-model").read == 0.05
    with pytest.raises(KeyError, match="unknown model"):
        get_model("gpt-4")
    with pytest.raises(ValueError):
        ModelInfo("bad", -1, 1, 1, 1, 1, 1, 1, 1, "sonnet", 1.0, True, "x")
    with pytest.raises(ValueError, match="source"):
        ModelInfo("bad", 1, 1, 1, 1, 1, 1, 1, 1, "sonnet", 1.0, True, "")


def test_the_price_table_covers_the_current_models_with_every_field() -> None:
    from dataclasses import fields

    from cachecompact.base.pricing import FAMILIES, known_models

    for name in known_models():
        m = get_model(name)
        if m.family == "custom":  # priced by a user (wrap(pricing=...) in another test of this process)
            continue
        for f in fields(m):
            v = getattr(m, f.name)
            assert v is not None and v != "", f"{name}: {f.name} is empty"
        assert m.family in FAMILIES and m.source
    s55 = get_model("claude-sonnet-5-5")
    assert (s55.input, s55.output, s55.write_5m, s55.write_1h, s55.read) == (2, 10, 2.5, 4, 0.1)
    assert (s55.context_window, s55.max_output, s55.token_ratio, s55.forced_tool_ok) == (1_000_000, 128_000, 1.3,
                                                                                         False)
    o55 = get_model("claude-opus-5-5")
    assert (o55.input, o55.output, o55.write_5m, o55.write_1h, o55.read, o55.forced_tool_ok) == (4, 20, 5, 8, 0.2,
                                                                                                  False)
    f52 = get_model("claude-fable-5-2")
    assert (f52.input, f52.output, f52.read, f52.forced_tool_ok) == (8, 40, 0.2, False)
    assert not get_model("claude-fable-5-1").forced_tool_ok and not get_model("claude-mythos-5-1").forced_tool_ok
    h55 = get_model("claude-haiku-5-5")
    assert (h55.input, h55.write_5m, h55.write_1h, h55.read, h55.output) == (0.10, 0.125, 0.20, 0.01, 0.50)
    assert FAMILIES["haiku"] == "claude-haiku-5-5"
    assert get_model("claude-sonnet-4-6").max_output == 128_000
    assert get_model("claude-haiku-4-5").token_ratio == 1.0 and get_model("claude-opus-4-7").token_ratio == 1.3


def test_read_shares_differ_by_model_and_every_ratio_comes_from_the_entry() -> None:
    shares = {m: round(get_model(m).read_share, 4) for m in
              ("claude-sonnet-4-6", "claude-opus-5-5", "claude-sonnet-5-5", "claude-fable-5-1", "claude-fable-5-2")}
    assert shares == {"claude-sonnet-4-6": 0.1, "claude-opus-5-5": 0.05, "claude-sonnet-5-5": 0.05,
                      "claude-fable-5-1": 0.025, "claude-fable-5-2": 0.025}
    s46 = get_model("claude-sonnet-4-6")
    assert s46.write_over_read("5m") == pytest.approx(12.5) and s46.write_over_read("1h") == pytest.approx(20)
    assert get_model("claude-fable-5-1").write_over_read("1h") == pytest.approx(80)


def test_haiku_5_5_bills_a_long_prompt_at_its_higher_tier_on_every_token() -> None:
    h = get_model("claude-haiku-5-5")
    short = {"input_tokens": 50_000, "cache_read_input_tokens": 50_000, "output_tokens": 1_000}
    assert h.cost(short) == pytest.approx((50_000 * 0.10 + 50_000 * 0.01 + 1_000 * 0.50) / 1e6)
    long = {"input_tokens": 50_000, "cache_read_input_tokens": 50_001, "output_tokens": 1_000}
    assert h.cost(long) == pytest.approx((50_000 * 0.50 + 50_001 * 0.05 + 1_000 * 2.50) / 1e6)
    assert h.at(100_000) is h and h.at(100_001).input == pytest.approx(0.5)


def test_sonnet_5_5_reads_at_the_price_of_the_day() -> None:
    from datetime import datetime

    s = get_model("claude-sonnet-5-5")
    before = datetime(2026, 10, 6, 23, tzinfo=UTC).timestamp()
    after = datetime(2026, 10, 7, 1, tzinfo=UTC).timestamp()
    assert s.as_of(before).read == 0.20 and s.as_of(after).read == 0.10 and s.as_of(None).read == 0.10


def test_an_unknown_model_gets_its_familys_prices_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from cachecompact.base.pricing import model_prices

    with caplog.at_level(logging.WARNING, "cachecompact"):
        a = model_prices("claude-sonnet-6-20270101")
        b = model_prices("claude-sonnet-6-20270101")
    assert a.input == get_model("claude-sonnet-5-5").input and a == b
    assert caplog.text.count("not in the price table") == 1
    with pytest.raises(KeyError):
        model_prices("gpt-4")
    with caplog.at_level(logging.WARNING, "cachecompact"):
        c = model_prices("gpt-4", default="claude-haiku-4-5")  # no family: the caller's default, named
    assert c.name == "gpt-4" and c.input == get_model("claude-haiku-4-5").input
    assert "using claude-haiku-4-5 prices" in caplog.text
    # the runtime: any name is priced (the default model's prices for one of no known family), and
    # the window of such a name is assumed 200k, not the default model's, said once
    from cachecompact.base.pricing import DEFAULT_PRICE_MODEL, UNKNOWN_MODEL_WINDOW, model_window, priced

    assert priced("my-local-model").input == get_model(DEFAULT_PRICE_MODEL).input
    assert priced("").name == get_model(DEFAULT_PRICE_MODEL).name
    caplog.clear()
    with caplog.at_level(logging.WARNING, "cachecompact"):
        assert model_window("my-local-model") == model_window("my-local-model") == UNKNOWN_MODEL_WINDOW
    assert caplog.text.count("assuming a 200000-token context window") == 1
    assert model_window("claude-haiku-4-5") == get_model("claude-haiku-4-5").context_window


def test_fidelity_against_recorded_claude_code_usage(shared_traces: Path) -> None:
    """The simulator reproduces Anthropic's billed read share on real sessions (see cache-model.md)."""
    from cachecompact.tools.bench.fidelity import session_fidelity, summarize
    from cachecompact.tools.traces import discover

    results = [r for f in discover([shared_traces / "claude-code"])[:4] if (r := session_fidelity(f))]
    s = summarize(results)
    assert s["calls"] > 100
    assert s["call_median"] < 0.02 and s["hit_miss_agreement"] > 0.9


def test_fit_line_recovers_a_known_line() -> None:
    from cachecompact.tools._logs import fit_line

    xs = [float(x) for x in range(10)]
    a, b = fit_line(xs, [5000 + 1.3 * x for x in xs])
    assert a == pytest.approx(5000) and b == pytest.approx(1.3)


def test_an_entry_lives_from_the_end_of_the_response_that_used_it() -> None:
    """Issue 50: a recorded log's long response ends minutes after its request left; what it read
    or wrote lives for the TTL from then (`SimRequest.done`). Both outcomes: the same second
    request reads with the response's end given, and misses counted from the request's start."""
    blocks = [SimBlock(b"sys", 5000, "text", "5m", True, "system[0]")]
    for done, read in ((None, 0), (240.0, 5000)):
        sim = CacheSimulator(lambda _: 1024)
        sim.process(SimRequest(model="claude-sonnet-4-6", time=0.0, blocks=blocks, n_system=1, done=done))
        r = sim.process(SimRequest(model="claude-sonnet-4-6", time=360.0, blocks=blocks, n_system=1))
        assert r.cache_read_input_tokens == read, done
