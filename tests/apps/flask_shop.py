"""A small shop on Flask and SQLAlchemy 2.x's ORM, as an application holds
them: a scoped_session per request, removed when the request ends (which
rolls back whatever it did not commit).

POST /orders {"item": ..., "fail": false}: adds an Order, enqueues its
shipping job with insert(session, ...) in the same transaction, then commits;
with "fail" it raises after the insert, as a payment declined late would, and
the request ends in a 500 with nothing committed.
"""

from __future__ import annotations

from flask import Flask, request
from sqlalchemy import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, scoped_session, sessionmaker

from lib.insert import insert


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "shop_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str]


class PaymentDeclined(Exception):
    pass


def make_app(engine: Engine) -> Flask:
    """The shop on engine; its table is made if missing."""
    Base.metadata.create_all(engine)
    session = scoped_session(sessionmaker(engine))
    app = Flask(__name__)

    @app.post("/orders")
    def add_order() -> tuple[dict[str, int | None], int]:
        body = request.get_json()
        order = Order(item=body["item"])
        session.add(order)
        session.flush()  # the order's id, for the job's args
        job_id = insert(session, "shop", "shop.Ship", {"order": order.id})
        if body.get("fail"):
            raise PaymentDeclined(f"order {order.id}")
        session.commit()
        return {"order": order.id, "job": job_id}, 201

    @app.teardown_appcontext
    def end_session(exc: BaseException | None) -> None:
        session.remove()

    return app
