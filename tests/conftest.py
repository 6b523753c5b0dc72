"""Shared fixtures and history builders for the tests."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SHARED_TRACES = Path(os.environ.get("CACHECOMPACT_TRACES", Path(__file__).resolve().parents[2] / "shared" / "traces"))

TOOLS = [{"name": "bash", "description": "Run a shell command.",
          "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}]
SYSTEM = "You are a careful coding agent."
# what every SDK sends and the API requires (api/versioning); raw HTTP clients in tests send it too
API_VERSION = {"anthropic-version": "2023-06-01"}


def turn(k: int, n_calls: int = 1, result: str | None = None) -> list[dict[str, Any]]:
    """One assistant turn with ``n_calls`` tool calls and the user message answering them."""
    calls = [{"type": "tool_use", "id": f"toolu_{k}_{c}", "name": "bash", "input": {"command": f"cat f{k}_{c}.py"}}
             for c in range(n_calls)]
    asst = {"role": "assistant", "content": [{"type": "text", "text": f"step {k}"}, *calls]}
    if not n_calls:
        return [asst, {"role": "user", "content": f"continue {k}"}]
    res = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": c["id"], "content": result or f"output of {c['id']}\n" * 20}
        for c in calls]}
    return [asst, res]


def history(n_turns: int, n_calls: int = 1) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test in foo.py"}]
    for k in range(n_turns):
        msgs += turn(k, n_calls)
    return msgs


def load_benchmark(name: str) -> ModuleType:
    """A script of benchmarks/ as a module (they are scripts, not a package), registered in
    sys.modules under a private name so that its dataclasses can find themselves."""
    spec = importlib.util.spec_from_file_location(f"cachecompact_bench_{name}",
                                                  Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


# -- markers: `pytest -m "not slow and not integration"` is the fast selection (README) --------------

_INTEGRATION_FIXTURES = frozenset({"pg_server", "pg_url"})  # a real PostgreSQL server
_SLOW_FIXTURES = frozenset({"shared_traces"})  # replays of whole recorded sessions


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark by what a test uses, so a new test is marked without anyone remembering to:
    ``integration`` when it needs a real external part (a PostgreSQL fixture, or a "postgres"
    parameter that asks for one at run time; the clients' tests mark their module), ``slow``
    when it replays the shared sessions (the other tests of a minute or more mark themselves)."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        spec = getattr(item, "callspec", None)  # a "postgres" parameter asks for the server at run time
        on_postgres = spec is not None and any(v == "postgres" for v in spec.params.values() if isinstance(v, str))
        if used & _INTEGRATION_FIXTURES or on_postgres:
            item.add_marker(pytest.mark.integration)
        if used & _SLOW_FIXTURES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def shared_traces() -> Path:
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"shared traces not present at {SHARED_TRACES}")
    return SHARED_TRACES


# -- a real PostgreSQL server -------------------------------------------------------------------------

from .pgserver import start_postgres  # noqa: E402


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The URL of a real PostgreSQL database: CACHECOMPACT_TEST_DATABASE_URL (CI starts one), else a
    throwaway server started here. Skips, saying why, only when neither works and CI did not ask
    for it (CACHECOMPACT_REQUIRE_POSTGRES=1 turns the skip into a failure)."""
    pytest.importorskip("psycopg", reason="the postgres extra is not installed")
    url = os.environ.get("CACHECOMPACT_TEST_DATABASE_URL")
    stop = None
    if not url:
        try:
            tmp = Path("/tmp") / f"cachecompact-pgtest-{os.getpid()}"
            tmp.mkdir(exist_ok=True)
            url, stop = start_postgres(tmp)
        except Exception as err:
            if os.environ.get("CACHECOMPACT_REQUIRE_POSTGRES") == "1":
                raise
            pytest.skip(f"no PostgreSQL server could be started: {err}")
    from cachecompact.store.postgres import migrate

    migrate(url)
    yield url
    if stop is not None:
        stop()


@pytest.fixture
def pg_url(pg_server: str) -> str:
    return pg_server


def fresh_database(url: str, name: str) -> str:
    """A new empty database on the same server (for migration and import tests)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.rsplit("/", 1)[0] + "/" + name
