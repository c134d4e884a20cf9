"""A psycopg2 connection to the database the worker uses, for a plain
synchronous program (a cron script, a web app) that enqueues with lib.insert.

Plain on purpose, like lib.insert: it never imports gevent. Which database:
DATABASE_URL when set; else the worker's embedded server (JOBS_DATA_DIR, or
the checkout's .pgdata/), started if it is not running. The embedded server
stops when the last process using it exits, so this process holds it, as a
worker does, until it exits: a script that enqueues with no worker running
leaves its rows in a server that the next worker starts again.
"""

from __future__ import annotations

from typing import Any

import psycopg2

from lib.setup import embedded
from lib.setup.settings import Settings


def database_url() -> str:
    """The URL the worker would use: DATABASE_URL, else the embedded server's.
    The settings are read from this program's environment as the worker reads
    its own, so a bad one is refused (SettingError) as the worker would: a
    DATABASE_URL the driver cannot parse is named with its password masked
    (the driver's own error would quote it)."""
    return embedded.database_url(Settings.from_environ())


# Seconds a connect may take unless the caller says otherwise: without one
# libpq waits on a host that does not answer for as long as TCP does (minutes).
CONNECT_TIMEOUT = 10


def connect(**kwargs: Any) -> psycopg2.extensions.connection:
    """A new psycopg2 connection (not in autocommit: `with conn:` commits or
    rolls back), given up after CONNECT_TIMEOUT seconds when the database
    does not answer; keyword arguments go to psycopg2.connect."""
    kwargs.setdefault("connect_timeout", CONNECT_TIMEOUT)
    return psycopg2.connect(database_url(), **kwargs)
