"""The worker of bench/idle.py: the real worker.main with --queues trivial queues
(q00, q01, ...) at the Poller's default poll interval, and the real schedule.

Every statement it sends is noted client-side (time, application_name, what,
whether it ended a transaction), and written as JSON lines to
$BENCH_STATEMENTS when the worker exits (SIGTERM): the benchmark counts them
by kind for its breakdown. A statement sent in autocommit is a transaction of
its own; one sent inside a transaction is not, and the COMMIT (or ROLLBACK)
that ends it is noted as one. Noting them adds nothing on the server.
DATABASE_URL names the database, as for the real worker.
"""

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psycopg2  # noqa: E402
import psycopg2.extensions  # noqa: E402

import worker  # noqa: E402
from lib.job import PendingJob  # noqa: E402
from lib.run.poller import Poller  # noqa: E402
from lib.store.db import DB  # noqa: E402
from queues.schedule import SCHEDULE  # noqa: E402

# (time.time(), application_name, kind, whether it ended a server transaction)
STATEMENTS: list[tuple[float, str, str, bool]] = []
_NAMED = re.compile(r"^\s*(PREPARE|EXECUTE)\s+(\w+)", re.IGNORECASE)


def kind(query: Any) -> str:
    """What a statement is: a named query of sql/ (prepared or executed), the
    pool's ping, LISTEN; several sent in one round trip are joined by '+'."""
    text = query.decode() if isinstance(query, bytes) else str(query)
    parts = []
    for part in text.split(";\n"):
        named = _NAMED.match(part)
        if named:
            verb, name = named.groups()
            parts.append(name if verb.upper() == "EXECUTE" else f"PREPARE {name}")
        elif part.strip() == "SELECT 1":
            parts.append("ping (SELECT 1)")
        else:
            parts.append(" ".join(part.split())[:40])
    return "+".join(parts)


class NotingCursor(psycopg2.extensions.cursor):
    def execute(self, query: Any, vars: Any = None) -> Any:
        # Several statements in one autocommit round trip run as one transaction.
        STATEMENTS.append((time.time(), _application(self.connection), kind(query), self.connection.autocommit))
        return super().execute(query, vars)


class NotingConnection(psycopg2.extensions.connection):
    """Notes the end of each transaction opened outside autocommit."""

    def commit(self) -> None:
        self._note("COMMIT")
        super().commit()

    def rollback(self) -> None:
        self._note("ROLLBACK")
        super().rollback()

    def _note(self, what: str) -> None:
        # Nothing is sent when no transaction is open.
        if self.info.transaction_status != psycopg2.extensions.TRANSACTION_STATUS_IDLE:
            STATEMENTS.append((time.time(), _application(self), what, True))


def _application(conn: psycopg2.extensions.connection) -> str:
    return conn.get_dsn_parameters().get("application_name", "")


def _noting_connect(connect: Callable[..., Any]) -> Callable[..., Any]:
    """psycopg2.connect that gives every connection the noting cursor, and notes
    the session's start: the server counts a transaction for it too."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cursor_factory", NotingCursor)
        kwargs.setdefault("connection_factory", NotingConnection)
        conn = connect(*args, **kwargs)
        STATEMENTS.append((time.time(), _application(conn), "session start", True))
        return conn

    return wrapper


# lib.store.db and lib.store.wakeups call psycopg2.connect by attribute at each connect.
psycopg2.connect = _noting_connect(psycopg2.connect)


def noop(job: PendingJob) -> str:
    return "ok"


def registry(count: int) -> list[Callable[[DB], Poller]]:
    # Default poll interval on purpose: the benchmark measures the defaults.
    return [lambda db, q=f"q{i:02d}": Poller(q, db, {f"{q}.Noop": noop}) for i in range(count)]


def main() -> int:
    try:
        return worker.main(registry(int(os.environ.get("BENCH_QUEUES", "40"))), [], schedule=SCHEDULE)
    finally:
        with open(os.environ["BENCH_STATEMENTS"], "w") as out:
            for row in STATEMENTS:
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    sys.exit(main())
