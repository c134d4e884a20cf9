import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

try:
    from django.tasks import default_task_backend
except ImportError:  # Django 5.2 with the backport
    from django_tasks import default_task_backend


class Command(BaseCommand):
    help = "Print the results of tasks by id, as a JSON list."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("ids", nargs="+")

    def handle(self, *args: Any, **options: Any) -> None:
        results = [default_task_backend.get_result(result_id) for result_id in options["ids"]]
        self.stdout.write(json.dumps([as_json(r) for r in results], default=str))


def as_json(result: Any) -> dict[str, Any]:
    return {
        "id": result.id,
        "task": result.task.module_path,
        "status": str(result.status),
        "return_value": result.return_value if result.status == "SUCCESSFUL" else None,
        "args": result.args,
        "kwargs": result.kwargs,
        "attempts": result.attempts,
        "worker_ids": result.worker_ids,
        "errors": [{"exception_class_path": e.exception_class_path, "traceback": e.traceback} for e in result.errors],
        "enqueued_at": result.enqueued_at,
        "started_at": result.started_at,
        "finished_at": result.finished_at,
    }
