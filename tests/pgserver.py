"""Start a throwaway PostgreSQL server from Debian's binaries (tests and benchmarks)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["start_postgres"]


def start_postgres(tmp: Path) -> tuple[str, Callable[[], None]]:
    """A throwaway server from Debian's postgresql binaries (as root, through the postgres user)."""
    import glob
    import shutil
    import socket
    import subprocess

    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not bins or os.geteuid() != 0 or shutil.which("runuser") is None:
        raise RuntimeError("no PostgreSQL binaries under /usr/lib/postgresql, or not root")
    pgbin = bins[-1]
    shutil.chown(tmp, "postgres", "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def run(*args: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *args], check=True, capture_output=True, timeout=120)

    run(f"{pgbin}/initdb", "-D", f"{tmp}/data", "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale",
        "--no-sync")
    run(f"{pgbin}/pg_ctl", "-D", f"{tmp}/data", "-l", f"{tmp}/log", "-w", "-t", "60", "-o",
        f"-c listen_addresses=127.0.0.1 -p {port} -k {tmp} -c fsync=off -c synchronous_commit=off "
        "-c max_connections=400", "start")
    run(f"{pgbin}/createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "cachecompact_test")

    def stop() -> None:
        """Stop the server and remove its folder."""
        try:
            run(f"{pgbin}/pg_ctl", "-D", f"{tmp}/data", "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return f"postgresql://postgres@127.0.0.1:{port}/cachecompact_test", stop


