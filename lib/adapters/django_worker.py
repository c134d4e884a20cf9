"""The worker's side of the Django tasks backend (lib/adapters/django_tasks.py):
a queue definition that runs a Django project's tasks.

    def make_emails(db):
        return django_queue("emails", settings="mysite.settings", modules=["shop.tasks"], concurrency=4)

Django is set up once per process, when the first such queue is defined; a
task runs in its slot's greenlet like any handler, with Django's database
connections of that greenlet."""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from traceback import format_exception
from typing import Any

import django
from django.apps import apps
from django.db import close_old_connections, connections
from django.utils import timezone

from lib.adapters.django_tasks import (
    RETURN_STEP,
    JobsBackend,
    Task,
    TaskContext,
    TaskError,
    TaskResultStatus,
    normalize_json,
    task_finished,
    task_started,
)
from lib.job import PendingJob
from lib.run.queue import Queue


class UnstorableResult(Exception):
    """The task returned a value Django cannot normalise to JSON. Final: the
    task ran, and running it again returns the same kind of value."""

    final = True


def django_queue(name: str, *, settings: str, modules: Sequence[str], **queue_options: Any) -> Queue:
    """The queue `name` of a Django project: it runs each task of `modules`
    that a JobsBackend may put on it (its backend's QUEUES hold the name, so
    a task sent there with .using(queue_name=...) is run too), by module path.
    settings: the DJANGO_SETTINGS_MODULE, unless the environment names one.
    queue_options: as for Queue (concurrency, max_attempts, job_timeout...)."""
    # Django's own variable, not ours: django.setup() reads it, and one set by the environment wins.
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", settings)
    if not apps.ready:
        django.setup()
    dispatch: dict[str, Callable[[PendingJob], str]] = {}
    for module_name in modules:
        module = importlib.import_module(module_name)
        for value in vars(module).values():
            if not isinstance(value, Task):
                continue
            backend = value.get_backend()
            if isinstance(backend, JobsBackend) and (not backend.queues or name in backend.queues):
                dispatch[value.module_path] = _handler(value, backend)
    if not dispatch:
        raise ValueError(f"django queue {name}: no task of {', '.join(modules)} runs on it through a JobsBackend")
    return Queue(name, dispatch, **queue_options)


def _handler(task: Task, backend: JobsBackend) -> Callable[[PendingJob], str]:
    def run(job: PendingJob) -> str:
        args = job.args.get("args", [])
        kwargs = job.args.get("kwargs", {})
        # Django keeps database connections per thread, which gevent makes
        # per greenlet: these are this slot's own. As around a request: a
        # connection past CONN_MAX_AGE, or broken, is closed before and after.
        close_old_connections()
        try:
            # Stored once per job: a run after its worker died returns the
            # stored value, and the task is not called again.
            job.step(RETURN_STEP, lambda: _call(task, backend, job, args, kwargs))
        except BaseException:
            # A task cut off mid-query (its timeout, a cancel) may leave a
            # connection no one can tell the state of: none is kept.
            with contextlib.suppress(Exception):
                connections.close_all()
            raise
        close_old_connections()
        return "ok"

    return run


def _call(task: Task, backend: JobsBackend, job: PendingJob, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """The task's return value, normalised as Django does; Django's
    task_started and task_finished sent around the call, with the job's row
    as a result (FAILED: this attempt raised; a retry may follow)."""
    result = backend.get_result(str(job.id))
    task_started.send(type(backend), task_result=result)
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        try:
            value = normalize_json(value)
        except (TypeError, ValueError) as exc:
            raise UnstorableResult(f"task {task.module_path} returned a value that cannot be stored: {exc}") from None
    except BaseException as exc:
        error = TaskError(
            exception_class_path=f"{type(exc).__module__}.{type(exc).__qualname__}",
            traceback="".join(format_exception(exc)),
        )
        now = timezone.now()
        failed = replace(result, status=TaskResultStatus.FAILED, finished_at=now, errors=[*result.errors, error])
        task_finished.send(type(backend), task_result=failed)
        raise
    done = replace(result, status=TaskResultStatus.SUCCESSFUL, finished_at=timezone.now())
    object.__setattr__(done, "_return_value", value)
    task_finished.send(type(backend), task_result=done)
    return value
