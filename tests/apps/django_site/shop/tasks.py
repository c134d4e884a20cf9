"""The site's tasks: one that returns a value, one that raises, one that
takes its context."""

from typing import Any

from django.db import connection

from shop.models import Order, Receipt

try:
    from django.tasks import task
except ImportError:  # Django 5.2 with the backport
    from django_tasks import task


class OutOfStock(Exception):
    pass


def label(order: Order) -> str:
    """A plain function: not a task."""
    return f"order {order.id}: {order.item}"


@task
def send_receipt(order_id: int) -> dict[str, Any]:
    order = Order.objects.get(id=order_id)
    Receipt.objects.create(order=order)
    # The driver the worker's Django connection uses, for the tests to see.
    return {"receipt": label(order), "driver": connection.Database.__name__}


@task
def reserve(item: str, count: int = 1) -> None:
    raise OutOfStock(f"no {item} left (wanted {count})")


@task(takes_context=True)
def attempt_of(context: Any, tag: str) -> dict[str, Any]:
    return {"tag": tag, "attempt": context.attempt, "id": context.task_result.id}
