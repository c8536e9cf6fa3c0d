"""A throwaway PostgreSQL server for tests and benchmarks, without Docker.

`start_postgres()` runs `initdb` and `pg_ctl` from the machine's PostgreSQL
(Debian's `postgresql` package: /usr/lib/postgresql/<version>/bin) in a
temporary directory, on a free loopback port, with trust authentication.
`initdb` refuses to run as root, so as root both run as the `postgres` user.
Durability is switched off (`fsync=off`): it is a test server.

    server = start_postgres()
    url = server.create_database()      # a fresh database per test
    ...
    server.restart()                    # the same data, a new server process
    server.stop()

`find_postgres_bin()` is None where PostgreSQL is not installed; tests skip
then, unless `CI` is set, where it is a failure (`tests/support.py`, `require`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

SUPERUSER = "postgres"


def find_postgres_bin() -> Path | None:
    """The directory holding `initdb`, `pg_ctl` and `postgres`, newest version first."""
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)
    for directory in candidates:
        if (directory / "initdb").exists() and (directory / "pg_ctl").exists():
            return directory
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PostgresServer:
    bin_dir: Path
    root: Path  # temporary directory: data, socket, log
    port: int

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        return self.root / "postgres.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str) -> None:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", SUPERUSER, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            log = (
                self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
            )
            raise RuntimeError(
                f"{' '.join(args[:2])} failed ({result.returncode}): "
                f"{result.stderr.strip() or result.stdout.strip()}\n{log}"
            )

    def initdb(self) -> None:
        self._run(
            "initdb", "-D", str(self.data_dir), "-U", SUPERUSER, "--auth=trust",
            "-E", "UTF8", "--no-sync", "--no-instructions",
        )  # fmt: skip

    def start(self) -> None:
        options = (
            f"-h 127.0.0.1 -p {self.port} -k {self.root} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
            "-c max_connections=200"
        )
        self._run(
            "pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_path), "-w", "-t", "60",
            "-o", options, "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """`fast`: disconnect clients and stop; `immediate`: as a crash would."""
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        self.stop()
        self.start()

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; its URL."""
        import psycopg

        name = name or f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def create_migrated_database(self) -> str:
        """A new database with the store's schema (the coordination's tables
        included), as an `inferd serve` leaves it; its URL."""
        from inferd.control.stores.sql.store import PostgresStore

        url = self.create_database()
        PostgresStore.open(url).close_sync()
        return url

    def destroy(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def start_postgres(bin_dir: Path | None = None) -> PostgresServer:
    """initdb + start in a new temporary directory; raises if it cannot."""
    bin_dir = bin_dir or find_postgres_bin()
    if bin_dir is None:
        raise RuntimeError("PostgreSQL is not installed (apt-get install -y postgresql)")
    root = Path(tempfile.mkdtemp(prefix="inferd-pg-"))
    # The server runs as `postgres` when we are root: it must own its files.
    root.chmod(0o777)
    server = PostgresServer(bin_dir, root, _free_port())
    try:
        server.initdb()
        server.start()
    except BaseException:
        server.destroy()
        raise
    return server
