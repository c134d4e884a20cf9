"""The database page (/admin/database): `worker.py doctor`'s findings, each
with its verdict and what to do (lib/operate/doctor.py), read when the page
is asked for."""

from __future__ import annotations

from typing import Any

from lib.operate import doctor
from lib.setup.logs import one_line
from lib.store.driver_errors import is_database_error, is_outage

# Each verdict's badge, in the page's colours for a finished job's kinds.
BADGES = {doctor.OK: "kind-ok", doctor.WARNING: "kind-retrying", doctor.BAD: "kind-err"}


def database_page(db: Any) -> dict[str, Any]:
    """The findings; a query the role may not run is said on the page (the
    database's outage is the endpoint's 503, as on every page)."""
    try:
        vitals, _, found = doctor.examine(db)
    except Exception as exc:
        if not is_database_error(exc) or is_outage(exc):
            raise
        error = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return {"error": one_line(error), "vitals": None, "findings": [], "verdict": None, "badges": BADGES}
    return {"error": None, "vitals": vitals, "findings": found, "verdict": doctor.worst(found), "badges": BADGES}
