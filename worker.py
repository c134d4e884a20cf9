from lib.greenlets.patch import patch_stdlib

patch_stdlib()  # first: every later import must see the cooperative stdlib

import logging  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterable, Sequence  # noqa: E402
from dataclasses import replace  # noqa: E402
from datetime import UTC, datetime, timedelta  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

import gevent  # noqa: E402
from gevent.event import Event  # noqa: E402

from lib.background import dedupe, worker_registry  # noqa: E402
from lib.background.clock import Clock, Scheduled  # noqa: E402
from lib.background.horizon_watch import HorizonWatch  # noqa: E402
from lib.background.leases import Leases, new_worker_id  # noqa: E402
from lib.background.rollup import Rollup  # noqa: E402
from lib.background.waits import Waits  # noqa: E402
from lib.greenlets import hub_watch, reports  # noqa: E402
from lib.greenlets.supervise import Supervisor  # noqa: E402
from lib.operate import overview, queue_state, setup_check  # noqa: E402
from lib.operate.queue_state import pause, resume  # noqa: E402
from lib.run.poller import Poller  # noqa: E402
from lib.run.queue import AUTH_PREFIX, Queue  # noqa: E402
from lib.run.rates import declare_rate  # noqa: E402
from lib.run.recovery import Recovery  # noqa: E402
from lib.run.runtime import Runtime  # noqa: E402
from lib.run.steps import Committer  # noqa: E402
from lib.setup import error_reports, logs  # noqa: E402
from lib.setup.dsn import dsn_place, mask_secret  # noqa: E402
from lib.setup.error_reports import Outage  # noqa: E402
from lib.setup.parsers import SettingError  # noqa: E402
from lib.setup.settings import Settings  # noqa: E402
from lib.store.db import DB  # noqa: E402
from lib.store.driver_errors import is_conn_failure, is_database_error  # noqa: E402
from lib.store.forks import refuse_fork  # noqa: E402
from lib.store.migrate import migrate  # noqa: E402
from lib.store.pool_connections import behind_pooler  # noqa: E402
from lib.store.retry_backoff import Backoff  # noqa: E402
from lib.store.wakeups import Listener  # noqa: E402

if TYPE_CHECKING:
    from argparse import Namespace

    from lib.http.httpd import Starting

log = logging.getLogger("jobs.worker")

Registry = Sequence[Callable[[DB], Queue]]

# run()'s default: the defaults, without HTTP endpoints (a test's worker).
NO_HTTP = Settings(http_addr=None)

# The pool's ceiling: one connection per poller slot, and a few for the lease
# keeper and the clock, so that every handler's own queries can run at once.
# Connections open only when used and close when idle (lib/store/db.py): the
# pollers' claims and outcomes share the group commit's one (lib/run/steps.py).
POOL_BUFFER = 4

# Seconds without a failure before a success ends a report of the database's
# outage: longer than the longest gap between two parts' failures while it
# lasts (the rescue's, a lease apart when idle).
OUTAGE_QUIET = 60.0

# How long the pollers interrupted at the end of the shutdown window have to
# write their outcomes (an interrupted job's, or one already on its way).
FINAL_WRITES = 30.0


def main(
    registry: Registry | Callable[[Settings], Registry],
    argv: Sequence[str] | None = None,
    schedule: Sequence[Scheduled] | Callable[[], Sequence[Scheduled]] = (),
) -> int:
    """The command line. registry: the queues, or a function that builds them
    from the settings (queues.registry: tokens, retention); a test's app
    passes its list. schedule: the entries, or a loader of them
    (lib.operate.setup_check.loader), whose fault is then one line, not a traceback."""
    try:
        settings = Settings.from_environ()
    except SettingError as exc:
        # Before logging and Sentry are set up: a bad setting is the operator's to fix, not an event.
        print(f"worker: {exc}", file=sys.stderr)
        return 2
    if not isinstance(registry, Sequence):
        registry = registry(settings)
    queues: list[Queue] = []
    try:
        # Before every command, check among them: check then fails on what the
        # worker refuses, and the worker refuses it before any part starts.
        if _is_check(argv):
            # check never connects: it defines the queues on a pool that never does.
            queues = setup_check.defined(registry, setup_check.unconnected())
        schedule = setup_check.checked(schedule)
    except SettingError as exc:
        print(f"worker: {exc}", file=sys.stderr)
        return 2
    args = _args(settings, sys.argv[1:] if argv is None else argv)
    # Every line, event and stored traceback is masked of the configured
    # secrets: a fault's message may quote one.
    logs.setup(settings.log_level, settings.log_format, error_reports.configure(settings))
    error_reports.init(settings.sentry_dsn)
    if args.command == "check":
        from lib.operate import registry_check

        # Needs no database: it reads the code, the SQL files and the schedule.
        return registry_check.main(queues, list(schedule), Path(__file__).resolve().parent, args.paths)
    url = settings.database_url or _embedded_url(settings)
    if args.command == "db-url":
        from lib.operate import commands

        # Only the URL: no pool, no migration.
        return commands.db_url(url, args, sys.stdout)
    size = len(registry) + POOL_BUFFER
    if args.command in (None, "run"):
        # --shutdown-window, when given, over JOBS_SHUTDOWN_WINDOW.
        return _start(url, size, registry, replace(settings, shutdown_window=args.shutdown_window), schedule)
    db = _connect_once(url, size, settings.pooled, args.command)
    if db is None:
        return 1
    try:
        _say_pooler(db, settings)
        # doctor reads the database as it is: one a migration would fail on is what it must explain.
        if args.command != "doctor":
            migrate(db)
        return _operate(db, args, registry)
    finally:
        db.close()


def _start(url: str, size: int, registry: Registry, settings: Settings, schedule: Sequence[Scheduled]) -> int:
    """The worker: its HTTP endpoints first, saying it is starting, so that
    /healthz answers while the database does not; then the database, waited
    for; then run(). SIGTERM while it waits stops it with 0."""
    stop = Event()
    supervisor = Supervisor(stop)
    for signum in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(signum, stop.set)
    starting = _serve_starting(settings, supervisor)
    try:
        db = _connect_at_start(url, size, settings.pooled, stop, starting)
        if db is None:
            log.info("stopped before the database answered")
            return 0
        try:
            _starting(starting, "starting: migrating the database")
            _say_pooler(db, settings)
            migrate(db)
            _starting(starting, "starting: building the queues")
            return run(db, registry, settings, schedule=schedule, stop=stop, supervisor=supervisor, starting=starting)
        except SettingError as exc:  # one only the registry can tell (JOBS_QUEUES, a constructor that raises)
            print(f"worker: {exc}", file=sys.stderr)
            return 2
        finally:
            db.close()
    finally:
        stop.set()
        gevent.killall(list(supervisor.greenlets.values()))


def _serve_starting(settings: Settings, supervisor: Supervisor) -> "Starting | None":
    """The HTTP server, started under the supervisor with the app that says
    the worker is starting, until run() hands it the worker's own; None when
    JOBS_HTTP_ADDR is off."""
    if settings.http_addr is None:
        return None
    # Only here: the endpoints load prometheus-client, which a worker that
    # serves none does without (lib/setup/counters.py).
    from lib.http.httpd import HttpServer, Starting

    starting = Starting()
    supervisor.spawn("http", HttpServer(settings.http_addr, starting).serve)
    return starting


# One try at the database gets this long, its connect and first statement
# both: libpq's connect_timeout does not bound a connect that waits through
# gevent's wait callback (lib/store/db.py), so a server that accepts the TCP
# connection and never answers would hold the try for ever.
CONNECT_TIMEOUT = 10.0


class Unreachable(Exception):
    """A try at the database failed: the message says why, on one line, with no password."""


def _connect_within(url: str, size: int, pooled: bool, timeout: float = CONNECT_TIMEOUT) -> DB:
    """The pool, once a first statement has run on it within timeout; raises
    Unreachable when the database cannot be reached (or refuses this worker)."""
    timer = gevent.Timeout(timeout)
    timer.start()
    try:
        return DB.connect(url, size=size, pooled=pooled)
    except gevent.Timeout as exc:
        if exc is not timer:
            raise
        raise Unreachable(f"no answer within {timeout:g}s") from None
    except Exception as exc:
        if not is_conn_failure(exc):
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise Unreachable(mask_secret(first, url)) from exc
    finally:
        timer.close()


def _connect_once(url: str, size: int, pooled: bool, command: str) -> DB | None:
    """The pool for an operator's command, or None after one line saying
    where the database is and why it could not be used: a command run by
    hand or by cron gives up within CONNECT_TIMEOUT rather than wait for a
    database that may never come."""
    try:
        return _connect_within(url, size, pooled)
    except Unreachable as exc:
        print(f"{command}: could not connect to the database at {dsn_place(url)}: {exc}", file=sys.stderr)
        return None


def _starting(starting: "Starting | None", state: str) -> None:
    """What /healthz says while the worker starts (nothing without HTTP)."""
    if starting is not None:
        starting.say(state)


def _connect_at_start(url: str, size: int, pooled: bool, stop: Event, starting: "Starting | None") -> DB | None:
    """The pool, once the database answers: a worker started while it is
    down (a host reboot, say) waits for it, with backoff, instead of dying.
    One line when it starts failing and one when it connects, and /healthz
    says it waits meanwhile. None: stopped first."""
    place = dsn_place(url)
    retry = Backoff()
    began = time.monotonic()
    while True:
        try:
            db = _connect_within(url, size, pooled)
        except Unreachable as exc:
            if not retry.failures:
                log.warning(
                    "database at start failing: could not connect to the database at %s: %s;"
                    " trying again with backoff, at most %gs apart",
                    place,
                    exc,
                    retry.cap,
                )
                error_reports.capture(exc.__cause__ or exc, message="database at start failing")
            _starting(starting, f"waiting for the database at {place}: {exc}")
            if stop.wait(retry.failed()):
                return None
            continue
        if retry.failures:
            log.warning(
                "database at start recovered: connected to the database at %s after %d failed tries over %.1fs",
                place,
                retry.failures,
                time.monotonic() - began,
            )
        return db


def _args(settings: Settings, argv: Sequence[str]) -> "Namespace | SimpleNamespace":
    """The command and its arguments. `python worker.py` alone runs the
    worker with the settings' shutdown window: what the parser would say
    (a test holds the two together), without loading it."""
    if not argv:
        return SimpleNamespace(command=None, shutdown_window=settings.shutdown_window)
    from lib.operate import cli

    return cli.make_parser(settings).parse_args(argv)


def _embedded_url(settings: Settings) -> str:
    # Imported here: a worker given DATABASE_URL never loads lib.setup.embedded.
    from lib.setup import embedded

    return embedded.database_url(settings)


def _say_pooler(db: DB, settings: Settings) -> None:
    """Once at start, before any statement that needs a session: a pooler in
    front of the server that JOBS_POOLER does not name. In session mode that
    is fine; in transaction mode the first prepared statement fails."""
    if settings.pooled:
        return
    try:
        with db.connection() as conn:
            pooled = behind_pooler(conn)
    except Exception as exc:
        if not is_database_error(exc):
            raise
        # A hint, not a reason to stop: the next statement meets the same fault.
        log.warning("could not tell whether DATABASE_URL goes through a connection pooler: %s", exc)
        return
    if pooled:
        log.warning(
            "DATABASE_URL goes through a connection pooler; if it is in transaction mode,"
            " set JOBS_POOLER=transaction (and DATABASE_DIRECT_URL for wakeups)"
        )


def _operate(db: DB, args: "Namespace | SimpleNamespace", registry: Registry) -> int:
    """The operator's commands; each prints what it did (lib/operate/commands.py)."""
    # Imported here: a worker that only runs never loads them (tqdm, the
    # tables' code and the registry check are memory it would hold for nothing).
    from lib.operate import commands, registry_check
    from lib.operate.known_names import known_handled, unknown_names

    out, err = sys.stdout, sys.stderr
    handled: dict[str, frozenset[str]] = {}
    queues: list[Queue] = []
    if args.command in ("status", "pause", "resume", "scale", "enqueue", "failed", "redrive", "retry"):
        try:
            queues = setup_check.defined(registry, db)
        except SettingError as exc:  # as the worker would refuse to start
            print(f"{args.command}: {exc}", file=err)
            return 2
        # The registry's queues and their job names, from the definitions
        # alone, and those live workers run (another release, another entry
        # point): a queue with no rows yet is listed, a job none runs refused.
        handled = known_handled(db, registry_check.handled(queues, []))
        # A slip in a name would pause nothing, or find nothing, and say it did.
        unknown = unknown_names(db, args, handled)
        if unknown is not None:
            print(f"{args.command}: {unknown}", file=err)
            return 2
    if args.command in ("redrive", "retry"):
        return commands.redrive_failed(db, args, out, err)
    if args.command == "doctor":
        from lib.operate import doctor

        return doctor.doctor(db, args, out, err)
    if args.command == "failed":
        return commands.failed(db, args, out)
    if args.command == "show":
        return commands.show(db, args, out, err)
    if args.command == "cancel":
        return commands.cancel(db, args, out, err)
    if args.command == "status":
        return commands.status(db, args, out, queues=handled)
    if args.command == "scale":
        return commands.scale(db, args, out, err, queues=queues)
    if args.command == "enqueue":
        args_type = registry_check.args_types(queues).get((args.queue, args.name))
        return commands.enqueue(db, args, out, err, handled=handled, args_type=args_type)
    if args.command == "pause":
        until = datetime.now(UTC) + timedelta(minutes=args.minutes) if args.minutes else None
        pause(db, args.queue, args.reason, until)
        print(f"paused {args.queue} until {until or 'resumed'}: {args.reason}")
    elif args.command == "resume":
        print(f"resumed {args.queue}" if resume(db, args.queue) else f"{args.queue} was not paused")
    return 0


def _is_check(argv: Sequence[str] | None) -> bool:
    """Whether the command is `check`, read before the arguments are parsed."""
    words = sys.argv[1:] if argv is None else argv
    return "check" in [w for w in words if not w.startswith("-")][:1]


def run(
    db: DB,
    registry: Registry,
    settings: Settings = NO_HTTP,
    *,
    schedule: Sequence[Scheduled] = (),
    stop: Event | None = None,
    supervisor: Supervisor | None = None,
    starting: "Starting | None" = None,
) -> int:
    """One supervised greenlet per poller slot, and the listener, the lease
    keeper, the clock and the HTTP endpoints (at settings.http_addr; None:
    none), until SIGTERM/SIGINT (or stop); then stop claiming, give running
    jobs the shutdown window, and write off the rest. starting: the app of the
    HTTP server already started (main's, under this supervisor), to hand the worker's app to."""
    refuse_fork()  # a handler's fork would clone the whole worker (lib/store/forks.py)
    stop = stop or Event()
    supervisor = supervisor or Supervisor(stop)
    # One report for an outage of the database, not one per queue or part,
    # and one per spell: a part that succeeds while others fail (a read while
    # writes are refused) does not end it.
    outage = Outage("database", quiet=OUTAGE_QUIET)
    queues, registered, declaring, known = _queues_to_run(db, registry, settings.queues, outage)
    # Before any part starts: a start-up report, not a step in their timing.
    _say_unrun(db, registered)
    legacy_age = max((q.job_timeout for q in queues), default=600.0) + 60
    listen_url = settings.listen_url(db.dsn)
    if listen_url is None:
        log.warning(
            "JOBS_POOLER=transaction and no DATABASE_DIRECT_URL: no LISTEN, so no wakeups;"
            " every queue polls every %gs (JOBS_POLL_INTERVAL)",
            settings.queue_poll_interval(listening=False),
        )
    worker_id = new_worker_id()
    handles = [(q.name, q.handles) for q in queues]
    seen = worker_registry.register(db, worker_id, [q.name for q in queues], settings.lease_seconds, handles)
    leases = Leases(
        db, worker_id=worker_id, lease=settings.lease_seconds, legacy_age=legacy_age, outage=outage, seen=seen
    )
    # What the worker's pollers share: its lease keeper, its group commit,
    # its outage report, its writers.
    committer = Committer(db)
    runtime = Runtime(
        leases,
        committer,
        outage=outage,
        poll_interval=settings.queue_poll_interval(listening=listen_url is not None),
        known=known,
    )
    pollers = [Poller(q, db, runtime) for q in queues]
    # The jobs that wait for others, released as those end (lib/background/waits.py).
    waits = Waits(db, outage, every=None if listen_url else settings.queue_poll_interval(listening=False))
    slots = sum(p.concurrency for p in pollers)
    if slots > len(pollers):
        db.grow(slots - len(pollers))
    listener = (
        Listener(
            listen_url,
            wake=_router(pollers),
            wake_all=lambda: (_wake(pollers), waits.wake()),
            outage=outage,
            state=queue_state.logger({p.queue for p in pollers}),
            # An operator's cancel: the handler of a job this process runs is told to stop.
            cancel=leases.cancel,
            waits=waits.wake,
        )
        if listen_url is not None
        else None
    )
    for signum in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(signum, stop.set)
    # Before the parts that report from native threads (the lease renewal,
    # the hub watch) start: their reports are sent from this hub's thread.
    reports.send_from_hub()
    hub_watch.watch(leases.lease / 3)

    # Apart, so that no database call, lock or stalled link stands between the
    # fence and a handler that must stop.
    helpers = [supervisor.spawn("leases", leases.run), supervisor.spawn("rescue", leases.run_rescue)]
    if declaring.left:
        helpers.append(supervisor.spawn("dedupe", declaring.run))
    if listener is not None:
        helpers.append(supervisor.spawn("listener", listener.run))
    if schedule:
        helpers.append(supervisor.spawn("clock", Clock(db, list(schedule), outage=outage).run))
    helpers.append(supervisor.spawn("rollup", Rollup(db, outage=outage).run))
    helpers.append(supervisor.spawn("waits", waits.run))
    # A transaction or slot that holds the horizon is told of once per hold.
    helpers.append(supervisor.spawn("horizon", HorizonWatch(db, outage=outage).run))
    # The database's return wakes every poller at once (lib/run/recovery.py).
    helpers.append(supervisor.spawn("recovery", Recovery(db, outage, lambda: _wake(pollers)).run))
    if settings.http_addr is not None:
        # Only here: the endpoints load prometheus-client, which a worker that
        # serves none does without (lib/setup/counters.py).
        from lib.http import httpd

        app = httpd.worker_app(
            db,
            admin_token=settings.admin_token,
            queues=[p.queue for p in pollers],
            concurrency={p.queue: p.concurrency for p in pollers},
            registered=registered,
            schedule=schedule,
            listener=listener,
            supervisor=supervisor,
            committer=committer,
            stop=stop,
            outage=outage,
        )
        if starting is None:
            supervisor.spawn("http", httpd.HttpServer(settings.http_addr, app).serve)
        else:
            starting.started(app)
        helpers.append(supervisor.greenlets["http"])
    elif settings.admin_token:
        log.warning("JOBS_ADMIN_TOKEN is set but JOBS_HTTP_ADDR is off: there is no admin page")
    greenlets = [
        supervisor.spawn(f"queue={p.queue} slot={slot}", partial(p.run_slot, slot=slot))
        for p in pollers
        for slot in range(p.concurrency)
    ]
    log.info("worker %s running %d queues: %s", leases.worker_id, len(pollers), ", ".join(p.queue for p in pollers))
    stop.wait()

    running = sum(len(p.running) for p in pollers)
    log.info("stopping: no new claims; %d running jobs get up to %gs", running, settings.shutdown_window)
    _wake(pollers)
    gevent.joinall(greenlets, timeout=settings.shutdown_window)
    left = [g for g in greenlets if not g.dead]
    if left:
        log.warning("shutdown window closed; interrupting %d running jobs", len(left))
        # A poller writing an outcome is killed once the write has landed.
        runtime.kills.kill(left, timeout=FINAL_WRITES)
    gevent.killall(helpers)
    worker_registry.unregister(db, leases.worker_id)
    log.info("stopped")
    return 0


def _say_unrun(db: DB, registered: Iterable[str]) -> None:
    """Once at start: rows of a queue that no registered queue is (a typo in
    an enqueue, a queue taken out) wait for ever, and only this line says so."""
    try:
        unrun = overview.unrun_queues(db, registered)
    except Exception as exc:  # a report, not a reason to stop the worker
        log.warning("could not look for queues no worker runs: %s", exc)
        return
    if unrun:
        log.warning("%s", overview.unrun_line(unrun))


def _wake(pollers: Sequence[Poller]) -> None:
    for poller in pollers:
        poller.wake()


def _router(pollers: Sequence[Poller]) -> Callable[[str], None]:
    """wake(queue) for the listener: the pollers of that queue, if this process runs it."""
    by_queue: dict[str, list[Poller]] = {}
    for poller in pollers:
        by_queue.setdefault(poller.queue, []).append(poller)
    return lambda queue: _wake(by_queue.get(queue, ()))


def _queues_to_run(
    db: DB, registry: Registry, only: frozenset[str] | None = None, outage: Outage | None = None
) -> tuple[list[Queue], dict[str, str | None], dedupe.Waiting, dict[str, frozenset[str]]]:
    """Define the queues; say once which are off and why, declare the job
    names that dedupe, and end the pauses a rejected token caused (this
    start may be the one after the token was fixed). The queues that run
    (those of `only`, JOBS_QUEUES, when given), every registered queue, the
    off ones too (their rows wait for a token or another process, not for a
    queue that does not exist), each with why it is off (None: on), and the
    declarations that must wait for transactions that wrote jobs, for the
    worker to retry while it runs, and the job names of every registered
    queue (those a follow-up may name without asking who handles it)."""
    queues: list[Queue] = []
    registered: dict[str, str | None] = {}
    declaring = dedupe.Waiting(db, outage)
    made: list[Queue] = setup_check.defined(registry, db)
    unknown = sorted((only or set()) - {q.name for q in made})
    if unknown:
        raise SettingError(f"JOBS_QUEUES names queues that are not registered: {', '.join(unknown)}")
    for queue in made:
        registered[queue.name] = queue.disabled_reason
        if only is not None and queue.name not in only:
            continue
        if queue.disabled_reason:
            log.warning("queue=%s is off: %s", queue.name, queue.disabled_reason)
            continue
        # Additive: a process that lists fewer names (an older release) cannot switch others off.
        if queue.dedupe and not dedupe.declare(db, queue.name, queue.dedupe):
            declaring.add_names(queue.name, queue.dedupe)
        if not declare_rate(db, queue.name, queue.rate, queue.budgets):
            declaring.add(f"queue={queue.name} rate", lambda q=queue: declare_rate(db, q.name, q.rate, q.budgets))
        if resume(db, queue.name, prefix=AUTH_PREFIX):
            log.info("queue=%s auth pause ended at start", queue.name)
        queues.append(queue)
    return queues, registered, declaring, {queue.name: queue.handles for queue in made}


if __name__ == "__main__":
    from queues import registry

    sys.exit(main(registry, schedule=setup_check.loader("queues.schedule")))
