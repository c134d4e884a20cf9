"""elsewhere_worker.py's schedule, with the mistake ELSEWHERE_SETUP names."""

import os

from lib.background.clock import Scheduled, daily, every
from lib.background.cron import cron

SETUP = os.environ.get("ELSEWHERE_SETUP", "ok")

SCHEDULE = [Scheduled("elsewhere", "elsewhere.Echo", daily(4, 0), args={"text": "nightly"})]
if SETUP == "duplicate":
    SCHEDULE.append(Scheduled("elsewhere", "elsewhere.Echo", daily(4, 0), args={"text": "nightly"}))
if SETUP == "every7":
    SCHEDULE.append(Scheduled("elsewhere", "elsewhere.Echo", every(7), args={"text": "often"}))
if SETUP == "badcron":
    SCHEDULE.append(Scheduled("elsewhere", "elsewhere.Echo", cron("0 25 * * *"), args={"text": "never"}))
