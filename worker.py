from gevent import monkey

monkey.patch_all()  # first: every later import must see the cooperative stdlib

import argparse  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from datetime import UTC, datetime, timedelta  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402
from gevent.event import Event  # noqa: E402

from lib import blocked, embedded, errors, registry_check  # noqa: E402
from lib.clock import Clock, Scheduled  # noqa: E402
from lib.db import DB, is_conn_failure  # noqa: E402
from lib.errors import Outage  # noqa: E402
from lib.leases import LEASE_SECONDS, Leases  # noqa: E402
from lib.migrate import migrate  # noqa: E402
from lib.poller import FINALIZING, Poller  # noqa: E402
from lib.queue_state import AUTH_PREFIX, pause, resume  # noqa: E402
from lib.redrive import redrive  # noqa: E402
from lib.sql import Q  # noqa: E402
from lib.supervise import Supervisor  # noqa: E402
from lib.wakeups import Listener  # noqa: E402

log = logging.getLogger("jobs.worker")

Registry = Sequence[Callable[[DB], Poller]]

# Connections beyond one per poller slot: the lease keeper, the clock, and a
# handler's own queries while its slot's connection is busy.
POOL_BUFFER = 4
SHUTDOWN_WINDOW = float(os.environ.get("JOBS_SHUTDOWN_WINDOW", "30"))
# How long a started row holds without renewal; a dead worker's jobs are taken
# back after about this long.
LEASE = float(os.environ.get("JOBS_LEASE_SECONDS", LEASE_SECONDS))


def main(registry: Registry, argv: Sequence[str] | None = None, schedule: Sequence[Scheduled] = ()) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    errors.init()
    if args.command == "check":
        # Needs no database: it reads the code, the SQL files and the schedule.
        return registry_check.main(list(registry), list(schedule), Path(__file__).resolve().parent)
    db = _connect(embedded.database_url(), size=len(registry) + POOL_BUFFER)
    try:
        migrate(db)
        if args.command in (None, "run"):
            return run(db, registry, shutdown_window=args.shutdown_window, schedule=schedule)
        return _operate(db, args)
    finally:
        db.close()


def _connect(url: str, size: int) -> DB:
    """The pool, once the database answers: a worker started while it is down
    (a host reboot, say) waits for it instead of dying, and reports once."""
    outage = Outage("database at start")
    wait = 1.0
    while True:
        try:
            db = DB.connect(url, size=size)
        except Exception as exc:
            if not is_conn_failure(exc):
                raise
            outage.failed(exc)
            gevent.sleep(wait)
            wait = min(wait * 2, 30.0)
            continue
        outage.recovered()
        return db


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="The jobs worker, and the commands to operate it.")
    parser.add_argument(
        "--shutdown-window",
        type=float,
        default=SHUTDOWN_WINDOW,
        help="seconds running jobs get to finish after SIGTERM (default %(default)s)",
    )
    commands = parser.add_subparsers(dest="command", metavar="command")
    commands.add_parser("run", help="run the worker (the default)")
    commands.add_parser("migrate", help="apply the migrations not yet applied, and exit")
    commands.add_parser("check", help="fail when a job is written that no worker handles")
    pause_ = commands.add_parser("pause", help="pause a queue for every worker")
    pause_.add_argument("queue")
    pause_.add_argument("--reason", required=True)
    pause_.add_argument("--minutes", type=float, help="end the pause by itself after this long")
    resume_ = commands.add_parser("resume", help="end a queue's pause")
    resume_.add_argument("queue")
    redrive_ = commands.add_parser("redrive", help="give failed (err:) jobs another attempt")
    redrive_.add_argument("--queue")
    redrive_.add_argument("--name")
    redrive_.add_argument("--id", type=int, action="append", dest="ids")
    return parser


def _operate(db: DB, args: argparse.Namespace) -> int:
    """The operator's commands; each prints what it did."""
    if args.command == "pause":
        until = datetime.now(UTC) + timedelta(minutes=args.minutes) if args.minutes else None
        pause(db, args.queue, args.reason, until)
        print(f"paused {args.queue} until {until or 'resumed'}: {args.reason}")
    elif args.command == "resume":
        print(f"resumed {args.queue}" if resume(db, args.queue) else f"{args.queue} was not paused")
    elif args.command == "redrive":
        try:
            done = redrive(db, ids=args.ids, queue=args.queue, name=args.name)
        except ValueError as exc:
            print(f"redrive: {exc}", file=sys.stderr)
            return 2
        ids = done.redriven
        print(f"redrove {len(ids)} jobs" + (f": {', '.join(map(str, ids))}" if ids else ""))
        if done.skipped:
            print(f"skipped {len(done.skipped)} jobs:")
            for job_id, why in done.skipped.items():
                print(f"  {job_id}: {why}")
    return 0


def run(
    db: DB,
    registry: Registry,
    *,
    shutdown_window: float = SHUTDOWN_WINDOW,
    lease: float = LEASE,
    schedule: Sequence[Scheduled] = (),
    stop: Event | None = None,
    supervisor: Supervisor | None = None,
) -> int:
    """One supervised greenlet per poller slot, and the listener, the lease
    keeper and the clock, until SIGTERM/SIGINT (or stop); then stop claiming,
    give running jobs the shutdown window, and write off the rest."""
    stop = stop or Event()
    supervisor = supervisor or Supervisor(stop)
    # One report for an outage of the database, not one per queue or part.
    outage = Outage("database")
    pollers = _start_pollers(db, registry)
    leases = Leases(db, lease=lease, legacy_age=max((p.job_timeout for p in pollers), default=600.0) + 60)
    leases.outage = outage
    for poller in pollers:
        poller.outage = outage
        poller.leases = leases
    slots = sum(p.concurrency for p in pollers)
    if slots > len(pollers):
        db.grow(slots - len(pollers))
    listener = Listener(db.dsn, wake=_router(pollers), wake_all=lambda: _wake(pollers), outage=outage)
    for signum in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(signum, stop.set)
    blocked.watch(leases.lease / 3)

    helpers = [supervisor.spawn("leases", leases.run), supervisor.spawn("listener", listener.run)]
    if schedule:
        helpers.append(supervisor.spawn("clock", Clock(db, list(schedule)).run))
    greenlets = [
        supervisor.spawn(f"queue={p.queue} slot={slot}", partial(p.run_slot, slot=slot))
        for p in pollers
        for slot in range(p.concurrency)
    ]
    log.info("worker %s running %d queues: %s", leases.worker_id, len(pollers), ", ".join(p.queue for p in pollers))
    stop.wait()

    running = sum(len(p.running) for p in pollers)
    log.info("stopping: no new claims; %d running jobs get up to %gs", running, shutdown_window)
    _wake(pollers)
    gevent.joinall(greenlets, timeout=shutdown_window)
    left = [g for g in greenlets if not g.dead]
    if left:
        log.warning("shutdown window closed; interrupting %d running jobs", len(left))
        gevent.killall(left, timeout=10)
    FINALIZING.join(timeout=30)
    gevent.killall(helpers)
    log.info("stopped")
    return 0


def _wake(pollers: Sequence[Poller]) -> None:
    for poller in pollers:
        poller.wake()


def _router(pollers: Sequence[Poller]) -> Callable[[str], None]:
    """wake(queue) for the listener: the pollers of that queue, if this process runs it."""
    by_queue: dict[str, list[Poller]] = {}
    for poller in pollers:
        by_queue.setdefault(poller.queue, []).append(poller)
    return lambda queue: _wake(by_queue.get(queue, ()))


def _start_pollers(db: DB, registry: Registry) -> list[Poller]:
    """Build the pollers; say once which queues are off and why, declare the
    job names that dedupe, and end the pauses a rejected token caused (this
    start may be the one after the token was fixed)."""
    pollers = []
    for make in registry:
        poller = make(db)
        if poller.off:
            log.warning("queue=%s is off: %s", poller.queue, poller.off)
            continue
        if poller.dedupe:
            # Additive: a process that lists fewer names (an older release) cannot switch others off.
            added, skipped = db.query_row(Q.dedupe_declare, {"queue": poller.queue, "names": sorted(poller.dedupe)})
            if added:
                names = ", ".join(added)
                log.info("queue=%s dedupes %s from now on; %d waiting copies skipped", poller.queue, names, skipped)
        if resume(db, poller.queue, prefix=AUTH_PREFIX):
            log.info("queue=%s auth pause ended at start", poller.queue)
        pollers.append(poller)
    return pollers


if __name__ == "__main__":
    from queues import REGISTRY
    from queues.schedule import SCHEDULE

    sys.exit(main(REGISTRY, schedule=SCHEDULE))
