"""`PostgresStore`: the session store contract on PostgreSQL, for fleets of agents and proxy replicas.

Why PostgreSQL: the logs are append-only, per-session sequences; a unique key on
``(session_id, log, seq)`` makes every append a compare-and-append (two writers can never both
write record N), and a transaction makes a multi-record append all-or-nothing. psycopg 3 with
a connection pool (the ``[postgres]`` extra); no table is created at import or connect time:
``cachecompact store migrate URL`` applies the versioned schema (`MIGRATIONS`).

Each record is stored as the exact canonical JSON bytes the file store writes as one line
(without the newline), so ``store export`` reproduces a session directory byte for byte and
the same verifier reads both. Hash chains are verified on read by `Session`, as for files.

The session lock is a transaction-scoped advisory lock on a connection the lock holds (a
crashed holder's lock ends with its connection). Every append is its own transaction on
another connection and commits before `append` returns, so what the session holds in memory
is always stored; a connection killed mid-append (a terminated backend) rolls that append
back and raises. Even without the lock, the unique key refuses a second record N. Reads are
incremental: ``read_new`` fetches records after the last one seen, never the whole session.
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any
from urllib.parse import unquote

import msgspec

from ..base.errors import (
    ConfigError,
    LedgerCorruptError,
    SessionExistsError,
    SessionLockedError,
    SessionNotFoundError,
    StoreConflictError,
    StoreError,
)
from ..base.wire import canonical_bytes
from .contract import LOGS, LogName, TornTail, blob_matches, check_blob_ref, check_ref, check_session_id
from .records import FORMAT, VERSION, decode_record

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg.conninfo import conninfo_to_dict
    from psycopg_pool import ConnectionPool
except ImportError as err:  # pragma: no cover - the extra is missing
    raise ImportError("the PostgreSQL store needs the postgres extra: pip install 'cachecompact[postgres]'") from err

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "PostgresSessionStore", "PostgresStore", "migrate", "schema_version"]

_DECODER = msgspec.json.Decoder()
RETRIES = 3  # attempts on a fresh connection after a dead one
_LOG_ID = {name: k for k, name in enumerate(LOGS)}

# Each migration moves the schema from version k to k + 1; never edit one that has shipped.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE cachecompact_sessions (
        session_id  text PRIMARY KEY,
        meta        bytea NOT NULL,          -- canonical JSON of session.json
        created_at  timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE cachecompact_records (
        session_id  text NOT NULL REFERENCES cachecompact_sessions ON DELETE CASCADE,
        log         smallint NOT NULL,       -- 0 transcript, 1 ledger, 2 requests
        seq         integer NOT NULL,        -- 1-based, the line number in the file store
        body        bytea NOT NULL,          -- canonical JSON, the line without its newline
        PRIMARY KEY (session_id, log, seq)
    );
    CREATE TABLE cachecompact_events (
        session_id  text NOT NULL REFERENCES cachecompact_sessions ON DELETE CASCADE,
        id          bigserial,
        body        bytea NOT NULL,
        PRIMARY KEY (session_id, id)
    );
    CREATE TABLE cachecompact_blobs (
        session_id  text NOT NULL REFERENCES cachecompact_sessions ON DELETE CASCADE,
        ref         text NOT NULL,           -- content address (sp_<sha256 prefix>)
        data        bytea NOT NULL,
        PRIMARY KEY (session_id, ref)
    );
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)


def _no_row_before_one(where: str, seq: int) -> None:
    """Rows are numbered from 1 (the line number in the file store): a row at ``seq`` 0 or below
    is no line of the log, and a reader that asked only for rows after the last one it read
    would never see it (issue 46); every read asks for them too, and fails here."""
    if seq < 1:
        raise LedgerCorruptError(where, seq, f"a row at seq {seq}: rows are numbered from 1, so this is no line of "
                                             "the log (written outside cachecompact)")
_VERSION_TABLE = "cachecompact_schema_version"


def _secrets(url: str) -> list[str]:
    """The password(s) a connection string carries, raw and decoded, longest first: whatever
    a message about it must not repeat (URI user info, ``?password=``, ``password=`` keywords)."""
    found: list[str] = []
    if "://" in url:
        rest = url.split("://", 1)[1]
        if "@" in rest:
            cred = rest.rsplit("@", 1)[0]
            if ":" in cred:
                found.append(cred.split(":", 1)[1])
    for m in re.finditer(r"password\s*=\s*('(?:[^'\\]|\\.)*'|[^\s&]*)", url):
        found.append(m.group(1).strip("'"))
    with contextlib.suppress(Exception):
        pw = conninfo_to_dict(url).get("password")
        if pw:
            found.append(str(pw))
    found += [unquote(x) for x in found]
    return sorted({x for x in found if x}, key=len, reverse=True)


def _redact(text: str, url: str | None = None) -> str:
    """``text`` with the password of ``url`` (default: ``text`` itself is the URL) masked."""
    for secret in _secrets(text if url is None else url):
        text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", "***", text)
    return text


def _cannot_connect(url: str, err: BaseException) -> ConfigError:
    """A connection error that names the server but never repeats its password."""
    why = " ".join(_redact(str(err).strip(), url).split())  # libpq's message spans lines: one line here
    return ConfigError(f"cannot connect to {_redact(url)}: {why[:300]}")


def _retryable(err: BaseException) -> bool:
    """A refused or timed-out connection may be a server still starting: worth the pool's retries.
    An unknown host, a bad connection string or a refused login is not."""
    msg = str(err).lower()
    return isinstance(err, psycopg.OperationalError) and ("refused" in msg or "timeout" in msg or "timed out" in msg)


def schema_version(conn: psycopg.Connection[Any]) -> int:
    """The applied schema version (0: none)."""
    row = conn.execute("SELECT to_regclass(%s)", (_VERSION_TABLE,)).fetchone()
    if row is None or row[0] is None:
        return 0
    got = conn.execute(f"SELECT max(version) FROM {_VERSION_TABLE}").fetchone()
    return int(got[0] or 0) if got else 0


def migrate(url: str) -> tuple[int, int]:
    """Apply the missing migrations in one transaction each; returns (before, after)."""
    try:
        conn = psycopg.connect(url, autocommit=False)
    except psycopg.Error as err:
        raise _cannot_connect(url, err) from None
    with conn:
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('cachecompact-migrate'))")
        conn.execute(f"CREATE TABLE IF NOT EXISTS {_VERSION_TABLE} (version integer PRIMARY KEY, "
                     "applied_at timestamptz NOT NULL DEFAULT now())")
        before = schema_version(conn)
        if before > SCHEMA_VERSION:
            raise ConfigError(f"{_redact(url)}: schema version {before} is newer than this build ({SCHEMA_VERSION})")
        for v in range(before, SCHEMA_VERSION):
            conn.execute(MIGRATIONS[v])
            conn.execute(f"INSERT INTO {_VERSION_TABLE} (version) VALUES (%s)", (v + 1,))
        conn.commit()
    return before, SCHEMA_VERSION


PROBE_TIMEOUT_S = 10.0  # the first connection attempt's limit (a silent host); the pool waits `timeout`
CONNECT_WAIT_S = 5.0  # how long a refused or timed-out server is waited for (it may be starting)


def _reach(url: str, wait: float) -> None:
    """Connect once directly before the pool opens, so a bad URL, an unknown host or a refused
    login fails at once, and a server that refuses or does not answer fails within ``wait``
    seconds, with one line (the pool would retry for its whole timeout, logging each try)."""
    deadline = time.monotonic() + wait
    while True:
        left = deadline - time.monotonic()
        try:
            psycopg.connect(url, connect_timeout=max(1, math.ceil(min(left, PROBE_TIMEOUT_S)))).close()
            return
        except Exception as err:
            if not _retryable(err) or time.monotonic() + 0.25 >= deadline:
                raise _cannot_connect(url, err) from None
        time.sleep(0.25)


class PostgresStore:
    """Sessions in one PostgreSQL database (``postgresql://user@host:port/db``)."""

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 16, timeout: float = 30.0,
                 lock_timeout: float = 10.0) -> None:
        self._url = url
        self.lock_timeout = lock_timeout  # as the file store: a writer that holds on longer is reported
        _reach(url, min(timeout, CONNECT_WAIT_S))
        self.pool = ConnectionPool(url, min_size=min_size, max_size=max_size, timeout=timeout, open=False,
                                   kwargs={"autocommit": True}, name="cachecompact")
        try:
            self.pool.open(wait=True, timeout=timeout)
        except Exception as err:
            self.pool.close()
            raise _cannot_connect(url, err) from None
        with self.pool.connection() as conn:
            v = schema_version(conn)
        if v != SCHEMA_VERSION:
            self.pool.close()
            raise ConfigError(f"{_redact(url)}: schema version {v}, this build needs {SCHEMA_VERSION}; run "
                              f"`cachecompact store migrate URL` first")
        self._locked = threading.local()  # per thread: {session id: the connection holding its lock}

    @property
    def url(self) -> str:
        return _redact(self._url)

    def held_locks(self) -> dict[str, psycopg.Connection[Any]]:
        """The session locks this thread holds, with their connections (a dict, never attributes
        named after session ids)."""
        held: dict[str, psycopg.Connection[Any]] | None = getattr(self._locked, "held", None)
        if held is None:
            held = self._locked.held = {}
        return held

    def _conn(self) -> contextlib.AbstractContextManager[psycopg.Connection[Any]]:
        return self.pool.connection()

    def create(self, session_id: str, meta: dict[str, Any]) -> PostgresSessionStore:
        check_session_id(session_id)
        data = canonical_bytes({**meta, "format": FORMAT, "version": VERSION})
        try:
            with self._conn() as conn:
                conn.execute("INSERT INTO cachecompact_sessions (session_id, meta) VALUES (%s, %s)",
                             (session_id, data))
        except pg_errors.UniqueViolation:
            raise SessionExistsError(f"{self.url}#{session_id}: already exists") from None
        except psycopg.Error as err:
            raise StoreError(f"{self.url}#{session_id}: cannot create: {str(err).strip()[:300]}") from None
        return PostgresSessionStore(self, session_id)

    def open(self, session_id: str) -> PostgresSessionStore:
        check_session_id(session_id)
        if not self.exists(session_id):
            raise SessionNotFoundError(f"{self.url}#{session_id}: no such session")
        return PostgresSessionStore(self, session_id)

    def exists(self, session_id: str) -> bool:
        try:
            with self._conn() as conn:
                row = conn.execute("SELECT 1 FROM cachecompact_sessions WHERE session_id = %s",
                                   (session_id,)).fetchone()
        except psycopg.Error as err:
            raise StoreError(f"{self.url}: {str(err).strip()[:300]}") from None
        return row is not None

    def delete(self, session_id: str) -> None:
        check_session_id(session_id)
        try:
            with self._conn() as conn:  # one statement: the records, events and blobs go with it
                n = conn.execute("DELETE FROM cachecompact_sessions WHERE session_id = %s", (session_id,)).rowcount
        except psycopg.Error as err:
            raise StoreError(f"{self.url}#{session_id}: cannot delete: {str(err).strip()[:300]}") from None
        if not n:
            raise SessionNotFoundError(f"{self.url}#{session_id}: no such session")

    def blob_owners(self, ref: str) -> list[str]:
        """Sessions holding scratchpad content ``ref``: one query. The primary key leads with the
        session, so this scans the blobs' rows (small: their data lives out of line)."""
        check_ref(ref)
        try:
            with self._conn() as conn:
                rows = conn.execute("SELECT session_id FROM cachecompact_blobs WHERE ref = %s ORDER BY session_id",
                                    (ref,)).fetchall()
        except psycopg.Error as err:
            raise StoreError(f"{self.url}: cannot look up scratchpad content: {str(err).strip()[:300]}") from None
        return [str(r[0]) for r in rows]

    def list(self, prefix: str = "") -> list[str]:
        try:
            with self._conn() as conn:
                rows = conn.execute("SELECT session_id FROM cachecompact_sessions WHERE starts_with(session_id, %s) "
                                    "ORDER BY session_id", (prefix,)).fetchall()
        except psycopg.Error as err:
            raise StoreError(f"{self.url}: {str(err).strip()[:300]}") from None
        return [r[0] for r in rows]

    def close(self) -> None:
        self.pool.close()


class PostgresSessionStore:
    """One session's rows. Positions for `read_new` are per instance, like the file store's offsets."""

    def __init__(self, store: PostgresStore, session_id: str) -> None:
        self.store = store
        self._sid = session_id
        self._seen: dict[LogName, int] = {k: 0 for k in LOGS}
        self._prefetched: list[Any] | None = None  # rows read together with the lock

    @property
    def session_id(self) -> str:
        return self._sid

    @property
    def location(self) -> str:
        return f"{self.store.url}#{self._sid}"

    def where(self, log: LogName) -> str:
        return f"{self.location}/{log}"

    @contextlib.contextmanager
    def _conn(self) -> Iterator[psycopg.Connection[Any]]:
        """The connection holding this session's lock when this thread holds it (no pool checkout),
        else a pooled one. Autocommit either way: every statement is durable when it returns."""
        held = self.store.held_locks().get(self._sid)
        if held is not None:
            yield held
            return
        with self.store.pool.connection() as conn:
            yield conn

    def _fail(self, what: str, err: Exception) -> StoreError:
        return StoreError(f"{self.location}: {what}: {str(err).strip()[:300]}")

    def lock(self) -> AbstractContextManager[None]:
        return self._lock()

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        held = self.store.held_locks()
        if self._sid in held:
            yield  # re-entrant within one thread
            return
        conn = self._locked_conn()
        held[self._sid] = conn
        try:
            yield
        finally:
            del held[self._sid]
            try:
                conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (self._sid,))
            except psycopg.Error:
                conn.close()  # a dead connection released its lock with it; never reuse an unsure one
            self.store.pool.putconn(conn)

    def _locked_conn(self) -> psycopg.Connection[Any]:
        """A pooled connection holding this session's advisory lock (a session-level lock: one
        round trip to take, one to release, and released by the server if the holder dies). A dead
        pooled connection (a restarted server, a terminated backend) is dropped and another tried."""
        last: Exception | None = None
        for _ in range(RETRIES):
            conn = self.store.pool.getconn()
            try:
                # the lock and a read of what others appended, in one round trip (a pipeline): the
                # session reads its logs right after locking, every turn
                query, args = self._new_rows_query(LOGS)
                with conn.pipeline():
                    conn.execute("SELECT set_config('lock_timeout', %s, false)",
                                 (f"{int(self.store.lock_timeout * 1000)}ms",))
                    conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (self._sid,))
                    cur = conn.execute(query, args)
                self._prefetched = cur.fetchall()
                return conn
            except pg_errors.LockNotAvailable:
                self.store.pool.putconn(conn)
                raise SessionLockedError(f"{self.location}: another writer holds the session lock (waited "
                                         f"{self.store.lock_timeout:g} s)") from None
            except psycopg.OperationalError as err:
                last = err
                self.store.pool.putconn(conn)  # broken: the pool discards it
            except BaseException:
                self.store.pool.putconn(conn)
                raise
        raise self._fail("cannot take the session lock", last or RuntimeError("no connection"))

    def _retrying(self, fn: Any, what: str) -> Any:
        """Run ``fn(conn)`` on a pooled connection, again on another if the first was dead. Safe for
        appends too: a retried append that had in fact committed meets the unique key and becomes
        a `StoreConflictError`, which the session resolves by reading what is stored."""
        last: Exception | None = None
        for _ in range(RETRIES):
            try:
                with self._conn() as conn:
                    return fn(conn)
            except psycopg.OperationalError as err:
                last = err
                continue
        raise self._fail(what, last or RuntimeError("no connection"))

    # -- metadata -------------------------------------------------------------------------------------

    def read_meta(self) -> dict[str, Any]:
        try:
            row = self._retrying(lambda conn: conn.execute(
                "SELECT meta FROM cachecompact_sessions WHERE session_id = %s", (self._sid,)).fetchone(),
                "cannot read the session metadata")
        except psycopg.Error as err:
            raise self._fail("cannot read the session metadata", err) from None
        if row is None:
            raise SessionNotFoundError(f"{self.location}: no such session")
        try:
            raw = bytes(row[0])
            meta = _DECODER.decode(raw)
        except msgspec.DecodeError as err:
            raise StoreError(f"{self.location}: unreadable session metadata: {err}") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise StoreError(f"{self.location}: not {FORMAT} version {VERSION} metadata")
        if raw != canonical_bytes(meta):  # docs/ledger-format.md, *session.json*
            raise StoreError(f"{self.location}: the session metadata is not in canonical JSON (bytes were changed)")
        return meta

    def write_meta(self, meta: dict[str, Any]) -> None:
        data = canonical_bytes({**meta, "format": FORMAT, "version": VERSION})
        try:
            with self._conn() as conn:
                conn.execute("UPDATE cachecompact_sessions SET meta = %s WHERE session_id = %s", (data, self._sid))
        except psycopg.Error as err:
            raise self._fail("cannot write the session metadata", err) from None

    # -- logs -------------------------------------------------------------------------------------------

    def _rows(self, log: LogName, after: int) -> list[tuple[int, Any]]:
        try:
            rows = self._retrying(lambda conn: conn.execute(
                "SELECT seq, body FROM cachecompact_records WHERE session_id = %s AND log = %s AND (seq > %s OR "
                "seq < 1) ORDER BY seq", (self._sid, _LOG_ID[log], after)).fetchall(), f"cannot read the {log} log")
        except psycopg.Error as err:
            raise self._fail(f"cannot read the {log} log", err) from None
        out: list[tuple[int, Any]] = []
        expect = after + 1
        for seq, body in rows:
            _no_row_before_one(self.where(log), seq)
            if seq != expect:
                raise LedgerCorruptError(self.where(log), expect, f"record {expect} is missing (next is {seq})")
            out.append((seq, decode_record(bytes(body), self.where(log), seq)))
            expect += 1
        return out

    def _new_rows_query(self, logs: tuple[LogName, ...]) -> tuple[str, list[Any]]:
        cond = " OR ".join("(log = %s AND (seq > %s OR seq < 1))" for _ in logs)
        args: list[Any] = [self._sid]
        for log in logs:
            args += [_LOG_ID[log], self._seen[log]]
        return (f"SELECT log, seq, body FROM cachecompact_records WHERE session_id = %s AND ({cond}) "
                "ORDER BY log, seq", args)

    def read_new_logs(self, logs: tuple[LogName, ...]) -> dict[LogName, list[tuple[int, Any]]]:
        """`read_new` for several logs in one round trip (what `Session` does every turn); right
        after `lock` the rows fetched with the lock are used."""
        pre, self._prefetched = self._prefetched, None
        if pre is not None and logs == LOGS and self._sid in self.store.held_locks():
            rows = pre
        else:
            query, args = self._new_rows_query(logs)
            try:
                rows = self._retrying(lambda conn: conn.execute(query, args).fetchall(),
                                      "cannot read the session's logs")
            except psycopg.Error as err:
                raise self._fail("cannot read the session's logs", err) from None
        out: dict[LogName, list[tuple[int, Any]]] = {log: [] for log in logs}
        for log_id, seq, body in rows:
            log = LOGS[log_id]
            _no_row_before_one(self.where(log), seq)
            expect = self._seen[log] + 1
            if seq != expect:
                raise LedgerCorruptError(self.where(log), expect, f"record {expect} is missing (next is {seq})")
            out[log].append((seq, decode_record(bytes(body), self.where(log), seq)))
            self._seen[log] = seq
        return out

    def read_new(self, log: LogName) -> tuple[list[tuple[int, Any]], TornTail | None]:
        rows = self._rows(log, self._seen[log])
        if rows:
            self._seen[log] = rows[-1][0]
        return rows, None  # a transaction is never torn

    def read_all(self, log: LogName) -> list[tuple[int, Any]]:
        return self._rows(log, 0)

    # `append` is an atomic compare-and-append by itself (the unique key), with or without the
    # session lock: a writer may append one record optimistically (`Session.record_request`)
    atomic_append = True

    def append(self, log: LogName, records: list[dict[str, Any]], at: int) -> None:
        if at != self._seen[log]:
            raise StoreConflictError(self.where(log), at, self._seen[log])
        seqs = [at + 1 + k for k in range(len(records))]
        bodies = [canonical_bytes(r) for r in records]

        def insert(conn: psycopg.Connection[Any]) -> None:
            # one statement, so one round trip, and atomic by itself: all records or none
            conn.execute("INSERT INTO cachecompact_records (session_id, log, seq, body) SELECT %s, %s, s, b "
                         "FROM unnest(%s::integer[], %s::bytea[]) AS t(s, b)",
                         (self._sid, _LOG_ID[log], seqs, bodies))
        try:
            self._retrying(insert, f"cannot append to the {log} log (nothing was written)")
        except pg_errors.UniqueViolation:
            # another writer appended record at + 1 first: nothing of ours was written
            raise StoreConflictError(self.where(log), at, at + 1) from None
        except psycopg.Error as err:
            raise self._fail(f"cannot append to the {log} log (nothing was written)", err) from None
        self._seen[log] = at + len(records)

    def repair(self, log: LogName) -> TornTail | None:
        return None  # nothing is ever torn

    def append_event(self, event: dict[str, Any]) -> None:
        try:
            with self._conn() as conn:
                conn.execute("INSERT INTO cachecompact_events (session_id, body) VALUES (%s, %s)",
                             (self._sid, canonical_bytes(event)))
        except psycopg.Error as err:
            raise self._fail("cannot append an event", err) from None

    def read_events(self) -> list[dict[str, Any]]:
        try:
            with self._conn() as conn:
                rows = conn.execute("SELECT body FROM cachecompact_events WHERE session_id = %s ORDER BY id",
                                    (self._sid,)).fetchall()
        except psycopg.Error as err:
            raise self._fail("cannot read the events", err) from None
        out = []
        for (body,) in rows:
            with contextlib.suppress(msgspec.DecodeError):
                d = _DECODER.decode(bytes(body))
                if isinstance(d, dict):
                    out.append(d)
        return out

    def put_blob(self, ref: str, data: bytes) -> None:
        check_blob_ref(ref, f"{self.location} (blobs)")
        try:
            with self._conn() as conn:
                # a stored row that no longer matches its name (damaged or edited) is mended by the
                # right bytes; bytes that do not match their name never replace a stored row
                mend = ("DO UPDATE SET data = EXCLUDED.data "
                        "WHERE cachecompact_blobs.data IS DISTINCT FROM EXCLUDED.data"
                        if blob_matches(ref, data) else "DO NOTHING")
                conn.execute("INSERT INTO cachecompact_blobs (session_id, ref, data) VALUES (%s, %s, %s) "
                             f"ON CONFLICT (session_id, ref) {mend}", (self._sid, ref, data))
        except psycopg.Error as err:
            raise self._fail("cannot store scratchpad content", err) from None

    def get_blob(self, ref: str) -> bytes | None:
        check_blob_ref(ref, f"{self.location} (blobs)")
        try:
            with self._conn() as conn:
                row = conn.execute("SELECT data FROM cachecompact_blobs WHERE session_id = %s AND ref = %s",
                                   (self._sid, ref)).fetchone()
        except psycopg.Error as err:
            raise self._fail("cannot read scratchpad content", err) from None
        return bytes(row[0]) if row else None

    def blob_refs(self) -> list[str]:
        with self._conn() as conn:
            return [r[0] for r in conn.execute("SELECT ref FROM cachecompact_blobs WHERE session_id = %s ORDER BY ref",
                                               (self._sid,)).fetchall()]
