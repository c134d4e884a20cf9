"""The schedule: the jobs the clock enqueues, and when (UTC). A new entry is one line."""

from lib.background.clock import Scheduled, daily
from lib.background.cron import cron

SCHEDULE: list[Scheduled] = [
    Scheduled("caches", "caches.Age", cron("*/15 * * * *")),
    # Retention: deletes old finished rows at a quiet hour, off the round minutes;
    # a deploy that spans 03:17 must not skip a day of it.
    Scheduled("maintenance", "maintenance.CleanUpJobs", daily(3, 17), catch_up=True),
]
