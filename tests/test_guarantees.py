"""Guarantee 3 with breakpoints on (across a restart and across processes), the first request
after a restart reading as much cache as an uninterrupted run, and the code's own rules: the
runtime's import layers, only the SDK's public names, no reading of other modules' private
fields."""

from __future__ import annotations

import ast
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import anthropic
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cachecompact import Session
from cachecompact.adapters.middleware import wrap
from cachecompact.base.errors import InvalidEditError
from cachecompact.history.ledger import ReplaceWithSummary, SkipRange
from cachecompact.tools.emulator import CLOCK_HEADER, Emulator

from .conftest import SYSTEM, TOOLS, history

PKG = Path(__file__).resolve().parents[1] / "cachecompact"


def _step(s: Session, op: str, a: int, w: int, full: list[dict[str, Any]], upto: int) -> int:
    if op == "append":
        upto = min(len(full), upto + 2)
        s.sync(full[:upto])
    elif op == "mark":  # the compactor's mark of its compacted part (kept in the request records)
        s.stable_before = a % (len(s) + 1) if w else None
    else:
        start = a % len(s)
        edit = SkipRange(start, min(len(s) - 1, start + w), "t") if op == "skip" else \
            ReplaceWithSummary(start, min(len(s) - 1, start + w), f"summary {start}", "t")
        with contextlib.suppress(InvalidEditError):
            s.edit(edit, level="manual", created_at="2026-11-30T00:00:00.000000Z")
    return upto


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=st.lists(st.tuples(st.sampled_from(["append", "append", "skip", "summary", "mark"]), st.integers(0, 60),
                                 st.integers(0, 6)), min_size=2, max_size=14),
       restart_at=st.integers(0, 13))
def test_guarantee_3_with_breakpoints_across_a_restart(script: list[tuple[str, int, int]], restart_at: int) -> None:
    """A live session and one reopened between turns (recorded requests persisted) render
    byte-identical requests, breakpoints included, at every step after the restart. (A mark set
    and never recorded, by a process that died before sending, is lost: the render then marks
    an earlier point, valid but re-writing more.)"""
    full = history(30, n_calls=2)
    with tempfile.TemporaryDirectory() as tmp:
        live = Session.create(Path(tmp) / "a", system=SYSTEM, tools=TOOLS)
        other = Session.create(Path(tmp) / "b", system=SYSTEM, tools=TOOLS)
        upto_a = upto_b = 3
        live.sync(full[:3])
        other.sync(full[:3])
        for k, (op, a, w) in enumerate(script):
            if k == restart_at:  # a restart between turns: only what is stored survives
                other = Session.open(Path(tmp) / "b")
            upto_a = _step(live, op, a, w, full, upto_a)
            upto_b = _step(other, op, a, w, full, upto_b)
            ra, rb = live.render(), other.render()
            assert ra.to_json() == rb.to_json(), f"step {k}"
            live.record_request(ra, {"step": k})
            other.record_request(rb, {"step": k})


def test_guarantee_3_across_processes_with_recorded_requests(tmp_path: Path) -> None:
    s = Session.create(tmp_path / "s", system=SYSTEM, tools=TOOLS)
    for n in range(3, 14):
        s.sync(history(n, n_calls=2))
        if n == 8:
            s.edit(SkipRange(4, 4), level="L1")
        if n == 9:
            s.stable_before = 5
        if n == 11:
            s.edit(ReplaceWithSummary(5, 12, "explored f3..f6"), level="L3")
            s.stable_before = 7
        s.record_request(s.render(model="claude-haiku-4-5", max_tokens=77), {"n": n})
    here = s.render(model="claude-haiku-4-5", max_tokens=77)
    assert len(here.breakpoints) >= 3  # the mark's among them
    code = ("import sys; from cachecompact import Session; s=Session.open(sys.argv[1]); "
            "sys.stdout.buffer.write(s.render(model='claude-haiku-4-5', max_tokens=77).to_json())")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s")], capture_output=True, check=True)
    assert out.stdout == here.to_json()


def test_two_writers_each_keep_their_own_mark_and_the_store_keeps_the_last(tmp_path: Path) -> None:
    """A writer that catches up on another's request record keeps its own compacted-part mark
    (its next render is planned from what it decided), and a reader sees the last record's."""
    a = Session.create(tmp_path / "s", system=SYSTEM, tools=TOOLS)
    a.sync(history(8, n_calls=2))
    a.record_request(a.render(), {"by": "a"})
    b = Session.open(tmp_path / "s")
    a.stable_before = 5
    a.record_request(a.render(), {"by": "a"})  # b has not seen this one
    assert b.stable_before is None
    b.stable_before = 7
    rec = b.record_request(b.render(), {"by": "b"})  # b catches up on a's record, then appends
    assert rec["stable_before"] == 7 and b.stable_before == 7
    store = Session.open(tmp_path / "s").store
    assert store is not None and [r["by"] for _, r in store.read_all("requests")] == ["a", "a", "b"]
    reader = Session.open(tmp_path / "s")
    assert reader.stable_before == 7 and reader.render().to_json() == b.render().to_json()
    b.stable_before = None  # b drops the mark (a collapse); a, two records behind, catches up and keeps its own
    b.record_request(b.render(), {"by": "b"})
    a.record_request(a.render(), {"by": "a"})
    assert a.stable_before == 5 and Session.open(tmp_path / "s").stable_before == 5


def test_the_first_request_after_a_restart_reads_the_cache_like_an_uninterrupted_run(tmp_path: Path) -> None:
    def run(restart_at: int | None, store: Path) -> list[int]:
        with Emulator() as emu:
            def fresh() -> Any:
                return wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=store,
                            summarizer=None, session_id="restart")
            client = fresh()
            for n in range(1, 25):
                if n == restart_at:
                    client = fresh()  # the agent process restarts; the store survives
                client.messages.create(model="claude-haiku-4-5", max_tokens=20, system=SYSTEM * 200, tools=TOOLS,
                                       messages=history(n, n_calls=2), extra_headers={CLOCK_HEADER: str(100 + n)})
            return [r["usage"]["cache_read_input_tokens"] for r in emu.requests if r.get("status") == 200]

    straight = run(None, tmp_path / "a")
    restarted = run(12, tmp_path / "b")
    assert restarted == straight and straight[12] > 0


# -- the code's own rules -----------------------------------------------------------------------------------

def _modules() -> list[tuple[str, ast.Module]]:
    out = []
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG).with_suffix("")
        out.append((".".join(rel.parts), ast.parse(p.read_text(), str(p))))
    return out


def _imports(mod: str, tree: ast.Module, *, with_names: bool = False) -> list[str]:
    """Absolute dotted names imported by a module of the package (``with_names``: for ``from X
    import y``, ``X.y`` too, which is a module when ``y`` is one)."""
    pkg = mod.split(".")[:-1]  # the package a module's relative imports start from
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - node.level + 1] if node.level > 1 else pkg
                target = ".".join(["cachecompact", *base, *(node.module.split(".") if node.module else [])])
            elif node.module:
                target = node.module
            else:
                continue
            names.append(target)
            if with_names:
                names += [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return names


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter's contracts from ``root``'s pyproject.toml, over the package found in ``root``."""
    exe = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(exe), "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)


def test_each_folder_is_a_layer() -> None:
    """The contracts in pyproject.toml: the layers in order, the emulator apart, no old alias used inside."""
    out = _lint_imports(PKG.parent)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "5 kept, 0 broken" in out.stdout


@pytest.mark.parametrize(("module", "bad_import", "message"), [
    ("base/wire.py", "from ..tools import cli", "cachecompact.base is not allowed to import cachecompact.tools"),
    ("cache/simulator.py", "from ..history import ledger",
     "cachecompact.cache is not allowed to import cachecompact.history"),
    ("tools/emulator/_request_handling.py", "from ...engine import request_cycle",
     "cachecompact.tools.emulator is not allowed to import "
                                                               "cachecompact.engine"),
    ("engine/_registry.py", "from .. import strategies", "cachecompact.engine is not allowed to import "
                                                         "cachecompact.strategies"),
])
def test_a_bad_import_fails_the_rules(tmp_path: Path, module: str, bad_import: str, message: str) -> None:
    """The rules are live: the same tree with one deliberate bad import fails them, naming it."""
    shutil.copytree(PKG, tmp_path / "cachecompact", ignore=shutil.ignore_patterns("__pycache__", "static"))
    shutil.copy(PKG.parent / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "cachecompact" / module
    target.write_text(target.read_text() + f"\n{bad_import}  # deliberate\n")
    out = _lint_imports(tmp_path)
    assert out.returncode != 0
    assert message in " ".join(out.stdout.split()), out.stdout


@pytest.mark.parametrize(("old", "new", "name"), [
    ("cachecompact.emulator", "cachecompact.tools.emulator", "Emulator"),
    ("cachecompact.report", "cachecompact.tools.session_report", "session_report"),
    ("cachecompact.strategies", "cachecompact.compaction.catalog", "register"),
    ("cachecompact.strategies", "cachecompact.compaction.strategy", "TurnReport"),
    ("cachecompact.strategies", "cachecompact.compaction.peers", "OpenHandsConfig"),
])
def test_the_documented_old_paths_work_for_one_release(old: str, new: str, name: str) -> None:
    """Code written against 0.2 keeps importing the same objects, and is told where they went and
    when the old path goes (one horizon for every deprecation: 0.4)."""
    import importlib

    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to.*goes in 0.4"):
        alias = importlib.import_module(old)
    assert getattr(alias, name) is getattr(importlib.import_module(new), name)
    assert name in alias.__all__


def _package_imports() -> dict[str, set[str]]:
    """The package's modules that each of its modules imports, old paths left out."""
    def dotted(mod: str) -> str:  # "tools.__init__" -> "cachecompact.tools"
        return ".".join(["cachecompact", *[p for p in mod.split(".") if p != "__init__"]])

    trees = {dotted(mod): (mod, tree) for mod, tree in _modules()}
    aliases = _old_paths()
    return {m: {n for n in _imports(mod, tree, with_names=True) if n in trees}
            for m, (mod, tree) in trees.items() if m not in aliases}


def test_a_private_module_is_used_only_by_its_own_folder() -> None:
    """CONTRIBUTING.md, *Public and private*: a `_` module is imported by its own folder alone
    (its siblings, the folder's `__init__.py` and what lies below it); a module another folder
    needs is public."""
    imports = _package_imports()
    private = [m for m in imports if "." in m and m.rsplit(".", 1)[1].startswith("_")
               and not m.endswith(".__main__")]
    assert len(private) >= 30
    for m in private:
        folder = m.rsplit(".", 1)[0]
        outside = sorted(i for i, targets in imports.items() if m in targets
                         and not (i == folder or i.startswith(folder + ".")))
        assert not outside, f"{m} is private but {', '.join(outside)} import it: make it public or move the use"


def test_every_old_path_warns_and_names_where_it_went() -> None:
    """Each module of the `aliases` contract is only an alias: importing it warns and names its
    new home (and one that hands over that module itself names it exactly)."""
    import importlib
    import warnings

    old_paths = sorted(_old_paths())
    assert len(old_paths) == 3  # the 0.2 paths (issue 49: no alias for one that never shipped)
    for old in old_paths:
        sys.modules.pop(old, None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(old)
        said = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
        assert any(m.startswith(f"{old} moved to ") for m in said), (old, said)
        if module.__name__ != old:  # a module's alias hands it over; a package's re-exports
            assert any(f"moved to {module.__name__}" in m for m in said), (old, said)


def test_observe_mode_does_not_load_the_compaction_runtime() -> None:
    """A proxy in observe mode forwards and analyses; the compactor, the engine and the session
    machinery load only in compact mode (the static half is the "observe" contract)."""
    probe = ("import sys\n"
             "from cachecompact.adapters.proxy import ProxyConfig, make_app\n"
             "make_app(ProxyConfig(upstream='http://127.0.0.1:9', mode=sys.argv[1]))\n"
             "print(' '.join(sorted(m for m in sys.modules if m.startswith(('cachecompact.compaction', "
             "'cachecompact.engine.request_cycle', 'cachecompact.engine._registry', "
             "'cachecompact.history.session')))))\n")
    observe = subprocess.run([sys.executable, "-c", probe, "observe"], capture_output=True, text=True, timeout=120)
    compact = subprocess.run([sys.executable, "-c", probe, "compact"], capture_output=True, text=True, timeout=120)
    assert observe.returncode == 0 and compact.returncode == 0, observe.stderr + compact.stderr
    assert observe.stdout.split() == []
    assert {"cachecompact.engine.request_cycle", "cachecompact.compaction.cache_aware"} <= set(compact.stdout.split())


def test_the_top_level_is_the_public_surface() -> None:
    """About 35 names a user needs, each resolving; the 0.3 names still resolve, to the same objects."""
    import cachecompact

    assert len(cachecompact.__all__) <= 40
    for name in cachecompact.__all__:
        assert getattr(cachecompact, name) is not None, name
    assert cachecompact.Compactor is cachecompact.CacheAwareCompactor
    assert cachecompact.register is cachecompact.register_strategy
    from cachecompact.base.errors import TokenizerError
    assert cachecompact.TokenizerError is TokenizerError


@pytest.mark.slow  # imports every module through pdoc: about 10 s
@pytest.mark.extras  # the PostgreSQL store is documented too, and importing it needs psycopg
def test_the_api_reference_is_current() -> None:
    """docs/api.md is generated from the docstrings; a changed public name or signature must
    regenerate it (``python docs/apidoc.py``)."""
    pytest.importorskip("psycopg", reason="documenting cachecompact.store.postgres needs the postgres extra: "
                                          "pip install -e '.[dev,postgres]' (CI runs this test after installing it)")
    out = subprocess.run([sys.executable, str(PKG.parent / "docs" / "apidoc.py"), "--check"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr


def test_only_the_sdks_public_names() -> None:
    bad = [f"{mod} imports {name}" for mod, tree in _modules() for name in _imports(mod, tree)
           if name.startswith(("anthropic._", "anthropic.lib._")) or (name.startswith("anthropic.") and
                                                                      any(p.startswith("_") for p in name.split(".")))]
    assert not bad, bad


def test_no_module_reads_another_modules_private_fields() -> None:
    """``obj._name`` (obj not self or cls) only for names the same module defines."""
    bad = []
    for mod, tree in _modules():
        own = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
               and n.value.id in ("self", "cls") and n.attr.startswith("_")}
        own |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                 ast.ClassDef))}
        own |= {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Name)}
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__"):
                if isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"):
                    continue
                if n.attr not in own:
                    bad.append(f"{mod}:{n.lineno} reads .{n.attr}")
    assert not bad, bad


def test_the_lowest_floor_loads_no_sdk() -> None:
    """`base/` is the floor everything stands on, the emulator and observe mode included: it
    imports no `anthropic` module (the SDK-flavoured `ContextFullError` lives in `adapters/`)."""
    probe = ("import sys, pkgutil, importlib, cachecompact.base as b\n"
             "[importlib.import_module(f\"cachecompact.base.{m.name}\") for m in pkgutil.iter_modules(b.__path__)]\n"
             "print(sorted(m for m in sys.modules if m == 'anthropic' or m.startswith('anthropic.')))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
    import anthropic

    import cachecompact
    assert issubclass(cachecompact.ContextFullError, anthropic.APIError)
    assert issubclass(cachecompact.ContextFullError, cachecompact.CacheCompactError)


def _old_paths() -> set[str]:
    """The modules kept for one release at a path that moved: the `aliases` import contract's list."""
    import tomllib

    conf = tomllib.loads((PKG.parent / "pyproject.toml").read_text())
    (aliases,) = [c for c in conf["tool"]["importlinter"]["contracts"] if c["id"] == "aliases"]
    return set(aliases["forbidden_modules"])


def test_a_module_has_a_name_of_its_own() -> None:
    """A module's file name is unique in the package (CONTRIBUTING.md, *Names*); a module kept
    for one release at its old path (the `aliases` contract) does not count, and is only that:
    it warns."""
    import collections

    import cachecompact

    pkg = Path(cachecompact.__file__).parent
    old = {str(Path(*m.split(".")[1:])) + ".py" for m in _old_paths()}
    where: dict[str, list[str]] = collections.defaultdict(list)
    for p in pkg.rglob("*.py"):
        rel = str(p.relative_to(pkg))
        if p.name != "__init__.py" and rel not in old:
            where[p.name].append(rel)
    shared = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not shared, shared
    for rel in old & {str(p.relative_to(pkg)) for p in pkg.rglob("*.py")}:
        assert "DeprecationWarning" in (pkg / rel).read_text(), rel


def test_the_constraints_file_pins_every_dependency_within_its_bounds() -> None:
    """constraints.txt makes the README's install reproducible (issue 46: only lower bounds, no
    lock): every dependency pyproject.toml names, core and extras, is pinned there to one version
    that its own bounds admit, so `pip install -c constraints.txt -e '.[dev,postgres]'` resolves."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    root = PKG.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    reqs += [Requirement(r) for group in project["optional-dependencies"].values() for r in group]
    pins: dict[str, str] = {}
    for line in (root / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not a pin (name==version)"
            pins[canonicalize_name(name)] = version
    missing = [r.name for r in reqs if canonicalize_name(r.name) not in pins]
    outside = [f"{r.name}=={pins[canonicalize_name(r.name)]} not in {r.specifier}" for r in reqs
               if canonicalize_name(r.name) in pins and pins[canonicalize_name(r.name)] not in r.specifier]
    assert missing == [] and outside == []
    readme = (root / "README.md").read_text()
    assert "pip install -c constraints.txt -e '.[dev]'" in readme.split("```", 2)[1]  # the README's install uses it


def test_the_readmes_test_command_says_why_each_test_skipped(tmp_path: Path) -> None:
    """Issue 50: the README says each skip explains itself, and `python -m pytest -q` printed no
    reason. The project's own settings (pyproject.toml, read from the root) now print them."""
    root = PKG.parent
    probe = tmp_path / "test_probe.py"
    probe.write_text("import pytest\n\ndef test_x() -> None:\n    pytest.skip('needs the probe part: install it')\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(root),
                          "-c", str(root / "pyproject.toml"), str(probe)], capture_output=True, text=True,
                         timeout=120, cwd=root)
    assert "needs the probe part: install it" in out.stdout, out.stdout


def test_the_changelog_cites_paths_that_exist_or_says_they_went() -> None:
    """Issue 50: the unreleased section cited module paths that had since become private
    (`compaction/lookback.py` for `_lookback.py`). Every package or repository path it cites
    exists, unless its sentence says the path went (gone, split, renamed, moved, removed)."""
    root = PKG.parent
    text = (root / "CHANGELOG.md").read_text().split("\n## ", 2)[1]  # the newest release's section
    gone = re.compile(r"\b(gone|split|renamed|moved|removed|deleted|never shipped|held)\b")
    stale = []
    for entry in re.split(r"\n(?=- )", text):
        for sentence in re.split(r"(?<=[.;])\s", entry):
            for path in re.findall(r"`([\w./-]+/[\w.-]+\.(?:py|md|toml|mjs))`", sentence):
                here = any((base / path).exists() for base in (root, PKG)) or any(PKG.rglob(path))
                if not here and not gone.search(sentence):
                    stale.append(path)
    assert stale == [], f"CHANGELOG.md cites paths that do not exist: {stale}"
