"""elsewhere_worker.py's schedule, with the mistake ELSEWHERE_SETUP names."""

import os

from lib.background.clock import Scheduled, daily, every

SETUP = os.environ.get("ELSEWHERE_SETUP", "ok")

SCHEDULE = [Scheduled("elsewhere", "elsewhere.Echo", daily(4, 0), args={"text": "nightly"})]
if SETUP == "duplicate":
    SCHEDULE.append(Scheduled("elsewhere", "elsewhere.Echo", daily(4, 0), args={"text": "nightly"}))
if SETUP == "every7":
    SCHEDULE.append(Scheduled("elsewhere", "elsewhere.Echo", every(7), args={"text": "often"}))
