"""A Django tasks backend: `task.enqueue()` writes a job row in the request's
own transaction, and a worker's queue made by lib/adapters/django_worker.py
runs it. Django 6's `django.tasks`, or Django 5.2 with the `django-tasks`
backport (the same API in the `django_tasks` module).

    TASKS = {"default": {
        "BACKEND": "lib.adapters.django_tasks.JobsBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"database": "default"},  # the Django database the jobs table is in
    }}

The web process imports this module: it imports Django and lib.insert alone,
never gevent or the worker's pool. A job's name is its task's module path,
its args {"args": [...], "kwargs": {...}} as Django normalises them, and
its task's return value the job's step "return_value" (PendingJob.step).
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connections
from django.utils import timezone
from django.utils.module_loading import import_string

from lib.insert import InvalidJob, callsite_of, check_name, insert
from lib.store.sql import Q

try:  # Django 6
    from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTask, TaskException, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
except ImportError:  # Django 5.2 with the backport
    from django_tasks import TaskContext, TaskResult, TaskResultStatus
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskException, TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

# The worker's side (django_worker.py) takes the framework's names from here too.
__all__ = [
    "RETURN_STEP",
    "DuplicateTask",
    "InvalidTask",
    "JobEnded",
    "JobsBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultStatus",
    "normalize_json",
    "task_finished",
    "task_started",
]

# The step a task's return value is stored as, once per job (PendingJob.step).
RETURN_STEP = "return_value"

# Frames of these modules are the framework's and this backend's, never the enqueuer's.
_FRAMEWORK = ("django.tasks", "django_tasks", "asgiref", __name__)
# The last frame of a traceback as Python prints it, and the exception line after it.
_FRAME = re.compile(r"^  File ", re.MULTILINE)
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")


class DuplicateTask(TaskException):
    """Nothing was enqueued: the task's queue dedupes its jobs (the worker's
    Queue(dedupe=...)), and a pending or started copy with the same args
    exists."""


class JobEnded(Exception):
    """Stands for what ended an attempt, or the job, when no exception of the
    task's did: a worker stopped or lost (an interrupted attempt), an
    operator's cancel, a job it waited for that did not end ok. Its TaskError's
    traceback is the job's status or error text."""


class JobsBackend(BaseTaskBackend):
    supports_defer = True
    supports_priority = True
    supports_get_result = True
    # The worker calls tasks in greenlets, not on an event loop.
    supports_async_task = False

    def validate_task(self, task: Task) -> None:
        """Django's rules, and the job's own: a queue and a module path the
        jobs table can hold. Runs when the task is declared."""
        super().validate_task(task)
        try:
            check_name("queue", task.queue_name)
            check_name("task path", task.module_path)
        except InvalidJob as exc:
            raise InvalidTask(str(exc)) from None

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Write the task's job in the caller's transaction on the backend's
        database: inside atomic() it exists exactly when that commits."""
        self.validate_task(task)
        path = task.module_path
        _check_importable(task)
        try:
            args, kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
        except (TypeError, ValueError) as exc:
            kind = TypeError if isinstance(exc, TypeError) else ValueError
            raise kind(f"task {path}: its args cannot be stored as JSON: {exc}") from exc
        try:
            job_id = insert(  # registry-check: names checked at run time
                self._connection(),
                queue=task.queue_name,
                name=path,
                args={"args": args, "kwargs": kwargs},
                run_at=self._run_at(task.run_after),
                priority=int(task.priority),
                callsite=_callsite(),
            )
        except InvalidJob as exc:
            # Only the args are left to refuse: validate_task took the rest.
            raise InvalidJob(f"task {path}: {exc}") from None
        if job_id is None:
            raise DuplicateTask(
                f"task {path}: not enqueued, queue {task.queue_name} dedupes it and a copy with these args is pending"
                " or running"
            )
        result = TaskResult(
            task=task,
            id=str(job_id),
            status=TaskResultStatus.READY,
            enqueued_at=timezone.now(),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The job's row as a result, in one query on the backend's database."""
        job_id = _job_id(result_id)
        with self._connection().cursor() as cur:
            cur.execute(Q.job_task_result, {"id": job_id, "step": RETURN_STEP})
            row = cur.fetchone()
        if row is None:
            raise TaskResultDoesNotExist(result_id)
        (_, name, args, status, created_at, started_at, finished_at, attempts, worker, errors, last_error) = row[:11]
        last_traceback, returned = row[11:]
        task = _task_named(name)
        if task is None:
            raise TaskResultDoesNotExist(result_id)
        stored = json.loads(args)
        attempt_errors = json.loads(errors) if errors else []
        state = _state(status)
        result = TaskResult(
            task=task,
            id=str(job_id),
            status=state,
            enqueued_at=created_at,
            started_at=started_at,
            # A job made pending again (a retry) keeps its last end until it ends anew.
            finished_at=finished_at if state in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED) else None,
            last_attempted_at=started_at,
            args=stored.get("args", []),
            kwargs=stored.get("kwargs", {}),
            backend=self.alias,
            errors=_errors(status, state, attempt_errors, last_error, last_traceback),
            worker_ids=_workers(attempts, worker, attempt_errors),
        )
        if state == TaskResultStatus.SUCCESSFUL and returned is not None:
            object.__setattr__(result, "_return_value", json.loads(returned))
        return result

    def _connection(self) -> Any:
        return connections[self.options.get("database", "default")]

    def _run_at(self, run_after: datetime | None) -> datetime | None:
        if run_after is not None and not settings.USE_TZ and timezone.is_naive(run_after):
            # Without USE_TZ Django means local times in TIME_ZONE; the row needs an instant.
            return timezone.make_aware(run_after)
        return run_after


def _check_importable(task: Task) -> None:
    """The worker finds a task by its module path: InvalidTask unless that
    path imports back to this task. Checked at enqueue, not in
    validate_task, which runs while the decorator does, before the module
    has the name."""
    path = task.module_path
    try:
        found: Any = import_string(path)
    except ImportError as exc:
        raise InvalidTask(f"task {path}: the worker could not import it ({exc})") from None
    if not isinstance(found, Task) or found.func is not task.func:
        what = "another task" if isinstance(found, Task) else f"a {type(found).__name__}, not a task"
        raise InvalidTask(
            f"task {path}: the worker could not import it: {path} names {what};"
            " declare tasks with @task on a module-level function and enqueue that"
        )


def _callsite() -> str:
    """file:line of the code that called enqueue, past Django's own frames,
    as lib.insert writes it."""
    frame = sys._getframe(1)
    while frame.f_back is not None and str(frame.f_globals.get("__name__", "")).startswith(_FRAMEWORK):
        frame = frame.f_back
    return callsite_of(frame)


def _job_id(result_id: str) -> int:
    text = str(result_id)
    if not text.isascii() or not text.isdigit() or not 0 < int(text) < 2**63:
        raise TaskResultDoesNotExist(result_id)
    return int(text)


def _task_named(name: str) -> Task | None:
    """The task a job's name imports to; None for a job that is not a task's."""
    try:
        found = import_string(name)
    except ImportError:
        return None
    return found if isinstance(found, Task) else None


def _state(status: str) -> TaskResultStatus:
    if status == "pending":
        return TaskResultStatus.READY
    if status == "started":
        return TaskResultStatus.RUNNING
    if status == "ok" or status.startswith("ok: "):
        return TaskResultStatus.SUCCESSFUL
    return TaskResultStatus.FAILED  # err:, fail:, skip:


def _errors(
    status: str, state: TaskResultStatus, attempts: list[dict[str, Any]], last_error: str | None, last_tb: str | None
) -> list[TaskError]:
    """One error per attempt that raised (or was cut off), oldest first; a
    job that ended failed or skipped without raising adds one for its status."""
    errors = [_error(e.get("traceback"), e.get("error") or "") for e in attempts]
    if state == TaskResultStatus.FAILED:
        if not status.startswith("err: "):
            errors.append(_error(None, status))
        elif not errors:
            # A row whose attempts' errors were not kept: its last error stands for them.
            errors.append(_error(last_tb, last_error or status))
    return errors


def _error(traceback: str | None, error: str) -> TaskError:
    """An attempt's error; JobEnded stands for an exception no traceback names."""
    path = _exception_path(traceback) if traceback else None
    return TaskError(exception_class_path=path or f"{__name__}.JobEnded", traceback=traceback or error)


def _exception_path(traceback: str) -> str | None:
    """The class path of the exception a traceback ends with: the first line
    at the margin after its last frame (a message and notes may follow it),
    which Python prints as `module.QualName: message`, a builtin without its
    module. None when the text has no such line."""
    frames = list(_FRAME.finditer(traceback))
    tail = traceback[frames[-1].end() :].partition("\n")[2] if frames else traceback
    for line in tail.splitlines():
        if line and not line[0].isspace():
            found = _EXCEPTION_LINE.match(line)
            if found is None:
                return None
            name = found.group(1)
            return name if "." in name else f"builtins.{name}"
    return None


def _workers(attempts: int, worker: str | None, errors: list[dict[str, Any]]) -> list[str]:
    """The worker of each attempt: the one its error names, else the row's
    (the last claim's), so there are as many as attempts."""
    by_attempt = {e.get("attempt"): e.get("worker") for e in errors}
    return [by_attempt.get(n) or worker or "unknown" for n in range(1, attempts + 1)]
