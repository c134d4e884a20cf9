"""What a handler sees: the job it is given, the statuses it returns, the
Snooze it raises, and its arguments read into a dataclass. Queues import
this and nothing of the engine; it imports nothing of the engine either."""

from lib.job.job import Handler, PendingJob, Snooze, Throttle, real_seconds
from lib.job.rate import Budget, Rate

__all__ = ["Budget", "Handler", "PendingJob", "Rate", "Snooze", "Throttle", "real_seconds"]
