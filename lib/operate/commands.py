"""The operator's commands (`python worker.py COMMAND`): one function each,
taking the pool and the parsed arguments, printing to the stream given, and
returning the exit code. worker.py holds only their parsers (which check
every value) and the dispatch.

Each prints a table for a person, or JSON with --json for a script. None
prints a job's args except `show`, which is asked for one job in full: args
may hold what the people who read a status screen should not see.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import socket
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime
from typing import IO, Any

from tqdm import tqdm

from lib.insert import InvalidJob, insert
from lib.job import status as st
from lib.job.args import ArgsError, unmarshal_args
from lib.operate import overview, queue_state
from lib.operate.cancel import cancel as cancel_jobs
from lib.operate.known_names import not_known
from lib.operate.overview import queue_stats, unrun_line, unrun_queues, workers
from lib.operate.redrive import RedriveResult, redrive
from lib.operate.tables import (
    cut,
    ids_text,
    is_tty,
    pause_text,
    print_json,
    print_steps,
    print_table,
    print_waits,
    time_text,
    worker_row,
)
from lib.setup.dsn import masked_dsn
from lib.setup.logs import one_line
from lib.store.sql import Q

# What a job enqueued from the command line records as its writer.
CLI_CALLSITE = "cli"
# Who a job cancelled from the command line was cancelled by.
CANCELLED_BY = "operator"
# Redrive works through this many jobs per statement: each batch commits on
# its own (an interrupted redrive keeps what it did) and moves the progress bar.
REDRIVE_BATCH = 500
# The longest status the failed table shows; --json and show give it whole.
STATUS_WIDTH = 100


def status(db: Any, args: argparse.Namespace, out: IO[str], *, queues: Iterable[str] = ()) -> int:
    """Every queue (those with rows or state, and the registry's queues given),
    then the live workers and the dead ones still holding started rows. Given
    the registry's queues, also those with due rows that none of them runs."""
    queues = list(queues)
    found = queue_stats(db, queues)
    known = workers(db)
    unrun = unrun_queues(db, queues) if queues else []
    if args.json:
        document = {"queues": [asdict(s) for s in found], "workers": [asdict(w) for w in known]}
        document["unrun"] = [{"queue": q, "due": n} for q, n in unrun]
        print_json(out, document)
        return 0
    now = datetime.now(UTC)
    headers = ["queue", "pending", "due", "delayed", "running", "oldest due"]
    headers += [f"{k} 1h" for k in ("ok", "fail", "skip", "err")] + [
        "retrying",
        "keys",
        "throttled until",
        "paused",
        "scaled",
    ]
    rows = [
        [
            s.queue,
            s.pending,
            s.due,
            # Of the delayed rows, those that wait for other jobs to end.
            f"{s.delayed} ({s.waiting} waiting)" if s.waiting else s.delayed,
            # A started job an operator cancelled runs on until its worker stops it.
            f"{s.running} ({s.cancelling} cancelling)" if s.cancelling else s.running,
            overview.age(s.oldest_due_age_s),
            *(s.done_1h[k] for k in ("ok", "fail", "skip", "err")),
            s.retrying,
            s.keys,
            time_text(s.throttled_until),
            pause_text(s),
            f"to {s.scaled_to} by {s.scaled_by}" if s.scaled_to else "-",
        ]
        for s in found
    ]
    if rows:
        print_table(out, headers, rows)
    else:
        print("no queues", file=out)
    if unrun:
        print(f"\n{unrun_line(unrun)}", file=out)
    live = [w for w in known if w.alive]
    dead = [w for w in known if not w.alive]
    print(f"\nlive workers: {len(live)}", file=out)
    if live:
        print_table(out, ["id", "host", "pid", "started", "last seen", "queues"], [worker_row(w, now) for w in live])
    if dead:
        print(f"\ndead workers still holding started rows: {len(dead)}", file=out)
        headers = ["id", "host", "pid", "started", "last seen", "holding", "queues"]
        print_table(out, headers, [worker_row(w, now, holding=True) for w in dead])
    return 0


def scale(db: Any, args: argparse.Namespace, out: IO[str], err: IO[str], *, queues: Sequence[Any]) -> int:
    """Set a queue's concurrency for every worker, up to its definition's:
    each process runs that many slots at most, so no more can be let in."""
    queue = next((q for q in queues if q.name == args.queue), None)
    if queue is None:
        print(f"scale: {args.queue} is run by another release: scale it from there, where its definition is", file=err)
        return 2
    if args.concurrency is not None and args.concurrency > queue.concurrency:
        print(
            f"scale: {args.queue} runs at most {queue.concurrency} at once (its definition's concurrency);"
            " raise that to go higher",
            file=err,
        )
        return 2
    queue_state.scale(db, args.queue, args.concurrency, f"cli {_who()}")
    to = args.concurrency or f"its definition's {queue.concurrency}"
    print(f"{args.queue} runs {to} at a time in every worker's next claim", file=out)
    return 0


def _who() -> str:
    """The person at the command line, as user@host, for whoever finds a queue scaled."""
    try:
        user = getpass.getuser()
    except Exception:  # no such user in a container's passwd, no LOGNAME
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def failed(db: Any, args: argparse.Namespace, out: IO[str]) -> int:
    """err: jobs, newest first; args never shown."""
    rows = _failed(db, queue=args.queue, name=args.name, since=args.since, limit=args.limit)
    if args.json:
        keys = ("id", "queue", "name", "attempts", "finished", "callsite", "status")
        print_json(out, [dict(zip(keys, row, strict=True)) for row in rows])
        return 0
    if not rows:
        print("no failed jobs", file=out)
        return 0
    print_table(
        out,
        ["id", "queue", "name", "attempts", "finished", "callsite", "status"],
        [[i, q, n, a, time_text(f), c or "-", cut(s, STATUS_WIDTH)] for i, q, n, a, f, c, s in rows],
    )
    return 0


def show(db: Any, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    """One job in full, args included: asked for by id. Then its steps, the
    results kept for its later runs: each whole in JSON, a preview here."""
    job = overview.job(db, args.id)
    if job is None:
        print(f"show: no job {args.id}", file=err)
        return 1
    steps = overview.job_steps(db, args.id)
    if args.json:
        listed = [{"name": n, "stored_at": at, "result": r} for n, at, r in steps.listed]
        print_json(out, {**job, "steps": listed, "steps_total": steps.total})
        return 0
    width = max(map(len, job)) + 2
    if job["status"] == st.STARTED and job["cancel_requested"]:
        job = {**job, "status": f"started, stopping: cancelled by {job['cancel_requested']}"}
    for key, value in job.items():
        if key not in ("args", "last_traceback", "attempt_errors"):
            shown = (
                time_text(value) if isinstance(value, datetime) else one_line(str(value)) if value is not None else "-"
            )
            print(f"{key:<{width}}{shown}", file=out)
    print("args:", file=out)
    print(json.dumps(job["args"], indent=2, ensure_ascii=False, sort_keys=True), file=out)
    if job["last_traceback"]:
        # As Python printed it, over several lines: the one field shown so.
        print("last traceback:", file=out)
        for line in job["last_traceback"].rstrip("\n").splitlines():
            print(one_line(line), file=out)
    if len(job["attempt_errors"]) > 1:
        print("each attempt's error:", file=out)
        for e in job["attempt_errors"]:
            print(f"  attempt {e.get('attempt')} at {e.get('at')}: {one_line(str(e.get('error')))}", file=out)
    if steps.listed:
        print_steps(steps.listed, steps.total, out)
    print_waits(overview.job_waits(db, args.id), out)
    return 0


def redrive_failed(db: Any, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    """lib.operate.redrive over the err: jobs the filters choose, in batches, newest
    failure first (so of a deduped job's copies the newest is the one that
    comes back, as in a single redrive). --dry-run does the same inside a
    transaction it rolls back: the answer is the real one, and nothing changes."""
    if not (args.ids or args.queue or args.name or args.since):
        print("redrive: needs ids, a queue or a name (or --since)", file=err)
        return 2
    ids = [row[0] for row in _failed(db, ids=args.ids, queue=args.queue, name=args.name, since=args.since)]
    bar = tqdm(
        total=len(ids),
        unit="job",
        desc="checking" if args.dry_run else "redriving",
        file=out,
        # A bar only for a person watching a long run; a script reads the summary.
        disable=not (is_tty(out) and len(ids) > REDRIVE_BATCH),
    )
    result = RedriveResult()
    with bar:
        if args.dry_run:
            with _rolled_back(db) as tx:
                _redrive_batches(tx, ids, result, bar, fresh=args.fresh)
        else:
            _redrive_batches(db, ids, result, bar, fresh=args.fresh)
    if args.ids:
        # Asked for by id but not failed: say why each was left alone.
        found = dict(db.query(Q.job_status_of, {"ids": sorted(set(args.ids) - set(ids))}))
        for job_id in set(args.ids) - set(ids):
            result.skipped[job_id] = _not_redriven(found.get(job_id))
    result.redriven.sort()
    result.skipped = dict(sorted(result.skipped.items()))
    if args.json:
        skipped = [{"id": i, "why": why} for i, why in result.skipped.items()]
        print_json(out, {"dry_run": args.dry_run, "redriven": result.redriven, "skipped": skipped})
        return 0
    would = "would " if args.dry_run else ""
    verb = "redrive" if args.dry_run else "redrove"
    print(f"{would}{verb} {len(result.redriven)} jobs{ids_text(result.redriven)}", file=out)
    if args.fresh and result.redriven:
        print(f"their steps {'would be ' if args.dry_run else ''}forgotten: each starts over", file=out)
    if result.skipped:
        print(f"{would}{'skip' if args.dry_run else 'skipped'} {len(result.skipped)} jobs:", file=out)
        for job_id, why in result.skipped.items():
            print(f"  {job_id}: {why}", file=out)
    if not ids and not args.ids:
        print(f"no err: job matches; {NOT_FAULTS}", file=out)
    if args.dry_run:
        print("dry run: nothing was changed", file=out)
    return 0


NOT_FAULTS = "fail: and skip: are answers a retry does not change, and are not redriven"


def _not_redriven(status: str | None) -> str:
    if status is None:
        return "no such job"
    try:
        kind = st.kind(status)
    except ValueError:
        return f"its status {status[:80]!r} is not a failure"
    if kind in (st.Kind.FAIL, st.Kind.SKIP):
        return f"it ended {status[:80]!r}; {NOT_FAULTS}"
    return f"it is {kind}, not failed"


def enqueue(
    db: Any,
    args: argparse.Namespace,
    out: IO[str],
    err: IO[str],
    *,
    handled: Mapping[str, Collection[str]] | None = None,
    args_type: type | None = None,
) -> int:
    """One job through lib.insert, recorded as written by the command line.
    A job that neither the registry nor a live worker handles is refused: its
    row would wait for ever. args_type: the dataclass its handler reads the
    args into, when it is known; args that do not fit it (a key it does not
    declare included: a person typed it) are refused."""
    if handled is not None and args.name not in handled.get(args.queue, ()):
        if args.queue not in handled:
            why = not_known("queue", args.queue, handled, "registered or run by a live worker")
        else:
            why = not_known("job name", args.name, handled[args.queue], f"handled in queue {args.queue}")
        print(f"enqueue: no worker runs job {args.name} on queue {args.queue}: {why}", file=err)
        return 2
    if args_type is not None:
        try:
            unmarshal_args(args_type, args.args or {}, strict=True)
        except ArgsError as exc:
            print(f"enqueue: args do not fit job {args.name}: {exc}", file=err)
            return 2
    try:
        job_id = insert(  # registry-check: names checked at run time
            db,
            args.queue,
            args.name,
            args.args,
            run_at=args.run_at,
            priority=args.priority,
            callsite=CLI_CALLSITE,
        )
    except InvalidJob as exc:
        print(f"enqueue: {exc}", file=err)
        return 2
    if args.json:
        print_json(out, {"id": job_id})
    elif job_id is None:
        print(f"not enqueued: a copy of {args.name} with these args is already pending or started", file=out)
    else:
        print(f"enqueued job {job_id}: queue={args.queue} job={args.name}", file=out)
    return 0


def cancel(db: Any, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    """End pending jobs as cancelled, and have the workers running started
    ones stop them (they end `skip: cancelled by operator` within a second,
    or at the end of their lease if the handler will not stop). A job that
    has ended is left alone and named, an unknown id is an error, and the
    exit code is then 1, so a script sees that not all were cancelled."""
    done = cancel_jobs(db, args.ids, CANCELLED_BY)
    if args.json:
        left = [{"id": i, "status": s} for i, s in done.left.items()] + [
            {"id": i, "status": None} for i in done.unknown
        ]
        print_json(
            out, {"cancelled": done.ended, "stopping": done.stopping, "left": sorted(left, key=lambda j: j["id"])}
        )
    else:
        print(f"cancelled {len(done.ended)} jobs{ids_text(done.ended)}", file=out)
        if done.stopping:
            print(
                f"stopping {len(done.stopping)} running jobs{ids_text(done.stopping)}"
                f" (their workers end them {st.cancelled(CANCELLED_BY)})",
                file=out,
            )
        if done.left:
            print(f"left {len(done.left)} jobs alone, already ended:", file=out)
            for job_id, was in done.left.items():
                print(f"  {job_id}: {cut(was, STATUS_WIDTH)}", file=out)
        for job_id in done.unknown:
            print(f"cancel: no job {job_id}", file=err)
    return 1 if done.left or done.unknown else 0


def db_url(url: str, args: argparse.Namespace, out: IO[str]) -> int:
    """The database the worker uses, password masked; for the embedded server
    its socket URL, which psql takes as it is."""
    shown = masked_dsn(url)
    if args.json:
        print_json(out, {"url": shown})
    else:
        print(shown, file=out)
    return 0


# Helpers


def _failed(
    db: Any,
    *,
    ids: Sequence[int] | None = None,
    queue: str | None = None,
    name: str | None = None,
    since: float | None = None,
    limit: int | None = None,
) -> list[tuple[Any, ...]]:
    params = {"ids": list(ids) if ids else None, "queue": queue, "name": name, "since": since, "limit": limit}
    return db.query(Q.job_failed, params)


def _redrive_batches(db: Any, ids: Sequence[int], result: RedriveResult, bar: tqdm, *, fresh: bool) -> None:
    for start in range(0, len(ids), REDRIVE_BATCH):
        batch = ids[start : start + REDRIVE_BATCH]
        done = redrive(db, ids=batch, fresh=fresh)
        result.redriven += done.redriven
        result.skipped.update(done.skipped)
        bar.update(len(batch))


class _Rollback(Exception):
    pass


@contextmanager
def _rolled_back(db: Any) -> Iterator[Any]:
    """A transaction that is always rolled back: a dry run makes every change
    and keeps none."""
    try:
        with db.transaction() as tx:
            yield tx
            raise _Rollback
    except _Rollback:
        pass
