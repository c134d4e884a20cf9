"""The operator's commands, run through worker.main as `python worker.py
COMMAND` runs them (in this process, for speed; a few run as real processes
for their exit codes), on a table of known rows: each one's table for a
person and its JSON for a script."""

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from factory import ago, later, make_job, make_jobs
from tests_support import ROOT

import worker
from lib.background import worker_registry
from lib.insert import insert
from lib.job.args import ArgsError, unmarshal_args
from lib.operate import commands, overview, queue_state, tables
from lib.operate.cli import make_parser
from lib.operate.queue_state import pause
from lib.operate.registry_check import handled
from lib.operate.setup_check import defined
from lib.setup import embedded
from lib.setup.dsn import masked_dsn
from lib.setup.settings import Settings
from queues import REGISTRY

SECRET_ARG = "args-are-private-4711"


@pytest.fixture
def cli(database_url, monkeypatch, capsys):
    """cli(*argv) -> (exit code, stdout, stderr), through worker.main."""
    monkeypatch.setenv("DATABASE_URL", database_url)

    def run(*argv: str, registry=REGISTRY) -> tuple[int, str, str]:
        try:
            code = worker.main(registry, list(argv))
        except SystemExit as exc:  # argparse: --help, or a bad value
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


def _job(db, queue="caches", name="caches.Age", status="pending", n=0, **cols) -> int:
    """A row of the status, with args a listing must not show."""
    return make_job(db, queue, name, {"secret": SECRET_ARG, "n": n}, status=status, **cols).id


def _lines(text: str) -> list[list[str]]:
    """A table's lines as cells (split on runs of two or more spaces)."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if line.strip()]


# status


def test_status_on_an_empty_table_lists_every_registered_queue_with_zeros(db, cli):
    # From the registry itself, so a queue a user adds does not break the test.
    registered = sorted(handled(defined(REGISTRY, db), []))
    assert {"caches", "github", "maintenance"} <= set(registered)
    n = len(registered)
    code, out, err = cli("status")
    assert code == 0, err
    rows = _lines(out)
    assert rows[0][:6] == ["queue", "pending", "due", "delayed", "running", "oldest due"]
    assert [r[0] for r in rows[1 : n + 1]] == registered
    assert all(r[1:] == ["0", "0", "0", "0", "-", "0", "0", "0", "0", "0", "0", "-", "-", "-"] for r in rows[1 : n + 1])
    assert rows[n + 1] == ["live workers: 0"]
    code, out, _ = cli("status", "--json")
    got = json.loads(out)
    assert got["workers"] == []
    assert [q["queue"] for q in got["queues"]] == registered
    assert got["queues"][0] == {
        "queue": registered[0], "pending": 0, "due": 0, "delayed": 0, "running": 0, "oldest_due_age_s": None,
        "done_1h": {"ok": 0, "fail": 0, "skip": 0, "err": 0}, "retrying": 0,
        "paused_until": None, "pause_reason": None, "throttled_until": None, "scaled_to": None, "scaled_by": None, "keys": 0,
        "counted_to": None,  # status counts every pending row
        "cancelling": 0, "waiting": 0,
    }  # fmt: skip


def test_status_shows_each_queue_and_the_workers_live_and_dead(db, cli):
    _job(db, run_at=ago(minutes=2), n=1)
    _job(db, run_at=later(hours=1), attempts=1, n=2)
    _job(db, "github", "github.FetchRepo", "started", worker_id="dead-1", n=3)
    _job(db, status="ok", n=4)
    _job(db, status="err: boom", n=5)
    _job(db, "odd", "odd.N", status="fail: no", finished_at=ago(minutes=5))  # a queue no worker runs
    until = datetime.now(UTC) + timedelta(minutes=30)
    pause(db, "github", "vendor incident", until)
    pause(db, "slack", "token rotation")
    db.exec("INSERT INTO job_queues (queue, next_claim_at) VALUES ('apollo', now() + interval '40 seconds')")
    queue_state.scale(db, "maintenance", 1, "cli someone@host")
    worker_registry.register(db, "web-1:42:abc", ["caches", "github"], 30.0)
    db.exec(
        "INSERT INTO workers VALUES ('dead-1', 'old-host', 7, '{github}', now() - interval '1 day', "
        "now() - interval '10 minutes', 30)"
    )
    code, out, err = cli("status")
    assert code == 0, err
    assert SECRET_ARG not in out
    rows = {r[0]: r for r in _lines(out)}
    assert rows["caches"][1:5] == ["2", "1", "1", "0"]
    assert re.fullmatch(r"2m0\ds", rows["caches"][5])
    assert rows["caches"][6:11] == ["1", "0", "0", "1", "1"]  # ok, fail, skip, err in the last hour; 1 retrying
    assert rows["github"][4] == "1"
    assert rows["github"][-2] == f"until {until:%Y-%m-%d %H:%M:%S}Z: vendor incident"
    assert rows["slack"][-2] == "until resumed: token rotation"
    assert rows["maintenance"][-1] == "to 1 by cli someone@host"
    assert rows["odd"][7] == "1"
    assert rows["apollo"][-3].endswith("Z") and rows["apollo"][-2:] == ["-", "-"]  # throttled, not paused or scaled
    assert (
        out.index("live workers: 1")
        < out.index("web-1:42:abc")
        < out.index("dead workers still holding started rows: 1")
        < out.index("dead-1")
    )
    dead = next(r for r in _lines(out) if r[0] == "dead-1")
    assert dead[1:3] == ["old-host", "7"] and dead[5:] == ["1", "github"]
    assert re.fullmatch(r"10m0\ds ago", dead[4])
    live = next(r for r in _lines(out) if r[0] == "web-1:42:abc")
    assert live[-1] == "caches, github"

    code, out, err = cli("status", "--json")
    assert code == 0, err
    got = json.loads(out)
    queues = {q["queue"]: q for q in got["queues"]}
    assert {k: queues["caches"][k] for k in ("pending", "due", "delayed", "running", "retrying")} == {
        "pending": 2, "due": 1, "delayed": 1, "running": 0, "retrying": 1,
    }  # fmt: skip
    assert 119 < queues["caches"]["oldest_due_age_s"] < 200
    assert queues["caches"]["done_1h"] == {"ok": 1, "fail": 0, "skip": 0, "err": 1}
    assert datetime.fromisoformat(queues["github"]["paused_until"]) == until
    assert queues["github"]["pause_reason"] == "vendor incident"
    assert datetime.fromisoformat(queues["slack"]["paused_until"]) == tables.FOREVER
    assert datetime.fromisoformat(queues["apollo"]["throttled_until"]) > datetime.now(UTC)
    assert [(w["id"], w["alive"], w["holding"]) for w in got["workers"]] == [
        ("dead-1", False, 1),
        ("web-1:42:abc", True, 0),
    ]
    assert set(got["workers"][0]) == {"id", "host", "pid", "started_at", "last_seen", "queues", "alive", "holding"}


# failed


def test_failed_lists_err_rows_newest_first_without_args(db, cli):
    assert cli("failed")[1] == "no failed jobs\n"
    assert json.loads(cli("failed", "--json")[1]) == []
    old = _job(db, status="err: old", finished_at=ago(hours=3), n=1)
    new = _job(db, "github", "github.FetchRepo", status="err: HTTP 500", finished_at=ago(minutes=1), attempts=0)
    two_lines = _job(db, status="err: first\nsecond " + "x" * 200, finished_at=ago(minutes=2), n=2)
    _job(db, status="fail: not an err", n=3)
    _job(db, n=4)
    code, out, err = cli("failed")
    assert code == 0, err
    assert SECRET_ARG not in out
    rows = _lines(out)
    assert rows[0] == ["id", "queue", "name", "attempts", "finished", "callsite", "status"]
    assert [int(r[0]) for r in rows[1:]] == [new, two_lines, old]
    assert rows[1][1:4] == ["github", "github.FetchRepo", "0"]
    assert rows[1][5].startswith("tests/db/test_commands.py:")
    assert rows[2][-1].startswith("err: first\\nsecond xxx") and rows[2][-1].endswith("…")
    assert len(out.splitlines()) == 4  # one line each, whatever the status holds
    assert [int(r[0]) for r in _lines(cli("failed", "--since", "1h")[1])[1:]] == [new, two_lines]
    assert [int(r[0]) for r in _lines(cli("failed", "--queue", "caches", "--limit", "1")[1])[1:]] == [two_lines]
    assert [int(r[0]) for r in _lines(cli("failed", "--name", "github.FetchRepo")[1])[1:]] == [new]
    got = json.loads(cli("failed", "--json", "--limit", "2")[1])
    assert [g["id"] for g in got] == [new, two_lines]
    assert set(got[0]) == {"id", "queue", "name", "attempts", "finished", "callsite", "status"}
    assert got[1]["status"].startswith("err: first\nsecond")  # whole, for a script
    assert SECRET_ARG not in json.dumps(got)


# show


def test_show_prints_one_job_in_full_with_its_args(db, cli):
    job_id = _job(db, status="err: boom", attempts=2, last_error="err: boom")
    code, out, err = cli("show", str(job_id))
    assert code == 0, err
    fields = dict(r for r in _lines(out.split("args:")[0]))
    assert fields["id"] == str(job_id) and fields["status"] == "err: boom" and fields["attempts"] == "2"
    assert fields["queue"] == "caches" and fields["started_at"] == "-"
    assert json.loads(out.split("args:\n", 1)[1]) == {"secret": SECRET_ARG, "n": 0}
    got = json.loads(cli("show", str(job_id), "--json")[1])
    assert got["args"] == {"secret": SECRET_ARG, "n": 0} and got["last_error"] == "err: boom"
    assert cli("show", "999999") == (1, "", "show: no job 999999\n")


def _steps(db, job_id: int, **results) -> None:
    for name, result in results.items():
        db.exec("INSERT INTO job_steps (job_id, name, result) VALUES (%s, %s, %s::jsonb)", (job_id, name, result))


def test_show_lists_the_jobs_steps_with_a_preview_of_each_result(db, cli, monkeypatch):
    job_id = _job(db, status="err: boom")
    _steps(db, job_id, summary=json.dumps({"text": "line\n" * 100}), tokens="[1200, 350]")
    _steps(db, _job(db), other='"another job"')
    code, out, err = cli("show", str(job_id))
    assert code == 0, err
    listed = out.split("steps (2), kept for the job's later runs:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in listed] == ["summary", "tokens"]
    assert listed[0].endswith(tables.preview({"text": "line\n" * 100})) and listed[0].endswith("…")
    assert len(tables.preview({"text": "line\n" * 100})) == tables.PREVIEW_CHARS
    assert listed[1].endswith("  [1200,350]")
    got = json.loads(cli("show", str(job_id), "--json")[1])
    assert [(s["name"], s["result"]) for s in got["steps"]] == [
        ("summary", {"text": "line\n" * 100}),
        ("tokens", [1200, 350]),
    ]
    assert got["steps_total"] == 2
    monkeypatch.setattr(overview, "STEPS_SHOWN", 1)
    assert cli("show", str(job_id))[1].endswith("  and 1 more\n")
    assert "steps" not in cli("show", str(_job(db, n=9)))[1]


def test_redrive_keeps_the_steps_and_fresh_forgets_them(db, cli):
    kept, fresh = _job(db, status="err: boom", n=1), _job(db, status="err: boom", n=2)
    _steps(db, kept, summary='"paid for"')
    _steps(db, fresh, summary='"paid for"')
    assert cli("redrive", "--id", str(kept))[1] == f"redrove 1 jobs: {kept}\n"
    code, out, _ = cli("redrive", "--id", str(fresh), "--fresh", "--dry-run")
    assert code == 0
    assert out.splitlines()[1:] == ["their steps would be forgotten: each starts over", "dry run: nothing was changed"]
    assert db.query("SELECT job_id FROM job_steps ORDER BY job_id") == [(kept,), (fresh,)]
    code, out, _ = cli("redrive", "--id", str(fresh), "--fresh")
    assert code == 0
    assert out.splitlines() == [f"redrove 1 jobs: {fresh}", "their steps forgotten: each starts over"]
    assert db.query("SELECT job_id FROM job_steps") == [(kept,)]


# redrive / retry


def test_redrive_since_and_dry_run(db, cli):
    recent = _job(db, status="err: boom", finished_at=ago(minutes=5), n=1)
    old = _job(db, status="err: boom", finished_at=ago(days=2), n=2)
    code, out, err = cli("retry", "--since", "1h", "--dry-run")
    assert code == 0, err
    assert out.splitlines() == [f"would redrive 1 jobs: {recent}", "dry run: nothing was changed"]
    assert db.query("SELECT status FROM jobs ORDER BY id") == [("err: boom",), ("err: boom",)]
    got = json.loads(cli("redrive", "--since", "1h", "--json")[1])
    assert got == {"dry_run": False, "redriven": [recent], "skipped": []}
    assert db.query_row("SELECT status FROM jobs WHERE id = %s", (recent,)) == ("pending",)
    assert db.query_row("SELECT status FROM jobs WHERE id = %s", (old,)) == ("err: boom",)
    assert cli("redrive") == (2, "", "redrive: needs ids, a queue or a name (or --since)\n")


def test_a_dry_run_says_which_copies_it_would_skip(db, cli):
    db.exec("INSERT INTO job_dedupe_names VALUES ('maintenance', 'maintenance.CleanUpJobs')")
    older = _job(db, "maintenance", "maintenance.CleanUpJobs", "err: boom", finished_at=ago(minutes=1))
    newer = _job(db, "maintenance", "maintenance.CleanUpJobs", "err: boom")
    _, out, _ = cli("redrive", "--queue", "maintenance", "--dry-run")
    assert out.splitlines() == [
        f"would redrive 1 jobs: {newer}",
        "would skip 1 jobs:",
        f"  {older}: job {newer}, a newer failure of the same job, was redriven",
        "dry run: nothing was changed",
    ]
    assert db.query_row("SELECT count(*) FROM jobs WHERE status = 'pending'") == (0,)


def test_across_batches_the_newest_failure_of_a_deduped_job_is_the_one_redriven(db, cli, monkeypatch):
    """Copies of one job may fall in different batches: the newest failure,
    in the first batch, comes back, and the older copy is skipped for it."""
    monkeypatch.setattr(commands, "REDRIVE_BATCH", 1)
    db.exec("INSERT INTO job_dedupe_names VALUES ('maintenance', 'maintenance.CleanUpJobs')")
    older = _job(db, "maintenance", "maintenance.CleanUpJobs", "err: boom", finished_at=ago(minutes=1))
    newer = _job(db, "maintenance", "maintenance.CleanUpJobs", "err: boom")
    code, out, err = cli("redrive", "--queue", "maintenance")
    assert code == 0, err
    assert out.splitlines() == [
        f"redrove 1 jobs: {newer}",
        "skipped 1 jobs:",
        f"  {older}: job {newer}, a copy of it, is already pending or started",
    ]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("env", [{}, {"JOBS_SHUTDOWN_WINDOW": "7"}])
def test_no_arguments_run_the_worker_as_the_parser_would_say(env):
    # worker.py alone skips the parser (memory an idle worker would keep): the same answer.
    settings = Settings.from_env(env)
    assert vars(worker._args(settings, [])) == vars(make_parser(settings).parse_args([]))


def test_a_long_redrive_shows_progress_on_a_terminal_only(db):
    n = commands.REDRIVE_BATCH * 2 + 10
    make_jobs(db, n, "caches", "caches.Age", [{"n": i} for i in range(1, n + 1)], status="err: boom")
    args = make_parser(Settings()).parse_args(["redrive", "--queue", "caches", "--dry-run"])
    terminal, pipe = _Terminal(), io.StringIO()
    assert commands.redrive_failed(db, args, terminal, io.StringIO()) == 0
    assert commands.redrive_failed(db, args, pipe, io.StringIO()) == 0
    assert f"{n}/{n}" in terminal.getvalue() and "\r" in terminal.getvalue()
    assert pipe.getvalue().startswith(f"would redrive {n} jobs: 1, 2, ")
    assert f", and {n - tables.LISTED_IDS} more\n" in pipe.getvalue()
    assert "\r" not in pipe.getvalue()
    args = make_parser(Settings()).parse_args(["redrive", "--queue", "caches"])
    assert commands.redrive_failed(db, args, terminal, io.StringIO()) == 0
    assert db.query_row("SELECT count(*) FROM jobs WHERE status = 'pending'") == (n,)


# enqueue


def test_enqueue_writes_through_insert_with_callsite_cli(db, cli):
    code, out, err = cli(
        "enqueue", "caches", "caches.Age", '{"k": "v"}', "--priority", "5", "--run-at", "2030-01-02T03:04:05Z"
    )
    assert code == 0, err
    [(job_id, args, priority, run_at, callsite)] = db.query("SELECT id, args, priority, run_at, callsite FROM jobs")
    assert out == f"enqueued job {job_id}: queue=caches job=caches.Age\n"
    assert (args, priority, callsite) == ({"k": "v"}, 5, "cli")
    assert run_at == datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    code, out, err = cli("enqueue", "caches", "caches.Age", "--json")
    assert (code, json.loads(out)) == (0, {"id": job_id + 1})
    assert db.query_row("SELECT args FROM jobs WHERE id = %s", (job_id + 1,)) == ({},)


def test_enqueue_of_a_deduped_copy_says_so(db, cli):
    db.exec("INSERT INTO job_dedupe_names VALUES ('maintenance', 'maintenance.CleanUpJobs')")
    assert cli("enqueue", "maintenance", "maintenance.CleanUpJobs")[0] == 0
    code, out, _ = cli("enqueue", "maintenance", "maintenance.CleanUpJobs")
    assert code == 0 and out.startswith("not enqueued: a copy of maintenance.CleanUpJobs")
    assert json.loads(cli("enqueue", "maintenance", "maintenance.CleanUpJobs", "--json")[1]) == {"id": None}


def test_enqueue_refuses_a_job_no_worker_runs(db, cli):
    assert cli("enqueue", "githb", "github.FetchRepo") == (
        2, "", "enqueue: no worker runs job github.FetchRepo on queue githb: no queue 'githb' is registered"
        " or run by a live worker (nearest: github)\n",
    )  # fmt: skip
    code, _, err = cli("enqueue", "caches", "caches.Nope")
    assert code == 2 and "no job name 'caches.Nope' is handled in queue caches (nearest: caches.Age)" in err
    code, _, err = cli("enqueue", "caches", "caches.Age", json.dumps({"big": "x" * 300_000}))
    assert code == 2 and err.startswith("enqueue: args are") and "the limit is" in err
    assert db.query_row("SELECT count(*) FROM jobs") == (0,)


def test_enqueue_refuses_args_that_do_not_fit_the_handlers_dataclass(db, cli):
    """slack.PostMessage reads its args into PostMessageArgs: a misspelt key
    is named, with the field it is nearest, and nothing is written."""
    code, out, err = cli("enqueue", "slack", "slack.PostMessage", '{"chanel": "#ops", "text": "hi"}')
    assert (code, out) == (2, "")
    assert err == (
        "enqueue: args do not fit job slack.PostMessage: PostMessageArgs: missing field 'channel';"
        " unknown key 'chanel' (did you mean 'channel'?)\n"
    )
    # Every field there, and one more: a person typed it, and it is refused too.
    code, _, err = cli("enqueue", "slack", "slack.PostMessage", '{"channel": "#ops", "text": "hi", "txet": "x"}')
    assert code == 2 and "PostMessageArgs: unknown key 'txet' (did you mean 'text'?)" in err
    assert db.query_row("SELECT count(*) FROM jobs") == (0,)
    code, _, err = cli("enqueue", "slack", "slack.PostMessage", '{"channel": "#ops", "text": "hi"}')
    assert code == 0, err
    assert db.query_row("SELECT args FROM jobs") == ({"channel": "#ops", "text": "hi"},)


def test_args_error_names_the_missing_and_the_unknown_keys():
    @dataclass
    class GreetArgs:
        name: str
        times: int = 1

    with pytest.raises(ArgsError) as missing:
        unmarshal_args(GreetArgs, {"nam": "ada"})
    assert str(missing.value) == "GreetArgs: missing field 'name'; unknown key 'nam' (did you mean 'name'?)"
    with pytest.raises(ArgsError) as wrong:
        unmarshal_args(GreetArgs, {"name": 7, "zzz": 1})
    assert (
        str(wrong.value)
        == "GreetArgs: field 'name' should be str, got int 7; unknown key 'zzz' (its fields: name, times)"
    )
    # Alone, an unknown key is still ignored (a producer deployed before its
    # consumer), unless asked to be strict.
    assert unmarshal_args(GreetArgs, {"name": "ada", "tims": 2}) == GreetArgs("ada")
    with pytest.raises(ArgsError, match=r"^GreetArgs: unknown key 'tims' \(did you mean 'times'\?\)$"):
        unmarshal_args(GreetArgs, {"name": "ada", "tims": 2}, strict=True)


# cancel


def test_cancel_ends_pending_jobs_stops_running_ones_and_names_the_others(db, cli):
    pending = _job(db, n=1)
    delayed = _job(db, run_at=later(days=1), n=2)
    running = _job(db, status="started", worker_id="w", n=3)
    done = _job(db, status="ok", n=4)
    code, out, err = cli("cancel", str(pending), str(delayed), str(running), str(done), "999999")
    assert code == 1, err
    assert out.splitlines() == [
        f"cancelled 2 jobs: {pending}, {delayed}",
        f"stopping 1 running jobs: {running} (their workers end them skip: cancelled by operator)",
        "left 1 jobs alone, already ended:",
        f"  {done}: ok",
    ]
    assert err == "cancel: no job 999999\n"
    rows = db.query("SELECT id, status, finished_at IS NOT NULL, cancel_requested FROM jobs ORDER BY id")
    assert rows == [
        (pending, "skip: cancelled by operator", True, None),
        (delayed, "skip: cancelled by operator", True, None),
        # Its worker ends it; until then it is started, and asked to stop.
        (running, "started", False, "operator"),
        (done, "ok", True, None),
    ]
    assert overview.queue_stats(db, ["caches"])[0].done_1h["skip"] == 2  # counted as skips, not errors
    again = _job(db, n=5)
    code, out, _ = cli("cancel", str(again), str(running), "--json")
    assert (code, json.loads(out)) == (0, {"cancelled": [again], "stopping": [running], "left": []})
    code, out, _ = cli("cancel", str(again), "999999", "--json")
    assert (code, json.loads(out)) == (
        1,
        {
            "cancelled": [],
            "stopping": [],
            "left": [{"id": again, "status": "skip: cancelled by operator"}, {"id": 999999, "status": None}],
        },
    )


def test_status_and_show_tell_a_started_job_an_operator_cancelled(db, cli):
    running = _job(db, status="started", worker_id="w", n=1)
    _job(db, status="started", worker_id="w", slot=1, n=2)
    assert cli("cancel", str(running))[0] == 0
    code, out, err = cli("status")
    assert code == 0, err
    [caches] = [r for r in _lines(out) if r[0] == "caches"]
    assert caches[4] == "2 (1 cancelling)"
    code, out, err = cli("show", str(running))
    assert code == 0, err
    shown = dict(line.split(None, 1) for line in out.splitlines()[:23] if " " in line.strip())
    assert shown["status"] == "started, stopping: cancelled by operator"
    assert shown["cancel_requested"] == "operator"


# db-url


def test_db_url_masks_the_password(cli, monkeypatch):
    url = "postgresql://jobs:s3cr3t-pw@db.example:5432/jobs"
    monkeypatch.setenv("DATABASE_URL", url)
    code, out, _ = cli("db-url")
    # The mask is lib.setup.settings' (its text may change); the password never shows.
    assert (code, out) == (0, masked_dsn(url) + "\n")
    assert "s3cr3t-pw" not in out and out.startswith("postgresql://jobs:") and out.endswith("@db.example:5432/jobs\n")
    assert json.loads(cli("db-url", "--json")[1]) == {"url": masked_dsn(url)}


def test_db_url_of_the_embedded_server_is_one_psql_takes():
    """With no DATABASE_URL, db-url prints the embedded server's socket URL,
    and psql connects with it as printed while a worker keeps the server up."""
    base = Path(tempfile.mkdtemp(prefix="jobs-dburl-"))
    base.chmod(0o711)  # as root the server runs as postgres, which must pass through
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env |= {"JOBS_EMBEDDED": "system", "JOBS_DATA_DIR": str(base)}
    try:
        # This process stands for a running worker: the server stops with its last user.
        running = embedded.start(base, "system")
        done = subprocess.run(
            [sys.executable, "worker.py", "db-url"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        url = done.stdout.strip()
        assert url == running
        answer = subprocess.run(["psql", url, "-Atc", "SELECT 41 + 1"], capture_output=True, text=True, timeout=30)
        assert answer.stdout.strip() == "42", answer.stderr
    finally:
        embedded.stop(base)
        shutil.rmtree(base, ignore_errors=True)


# bad arguments


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["failed", "--since", "1y"], "argument --since: a duration like 30m, 1h or 2d"),
        (["failed", "--since", "0m"], "argument --since: a duration"),
        (["failed", "--since", "99999999999d"], "argument --since: a duration"),
        (
            ["failed", "--since", "36501d"],
            "argument --since: a duration like 30m, 1h or 2d, above 0 and at most 36500d",
        ),
        (["failed", "--limit", "0"], "argument --limit: a whole number from 1 to 10000"),
        (["failed", "--limit", "many"], "argument --limit"),
        (["failed", "--queue", ""], "argument --queue: a non-empty text"),
        (["show"], "the following arguments are required: id"),
        (["show", "abc"], "argument id: a job id (a whole number)"),
        (["redrive", "--since", "soon"], "argument --since: a duration"),
        (["retry", "--id", "-1"], "argument --id"),
        (["enqueue", "caches"], "the following arguments are required: name"),
        (["enqueue", "caches", "caches.Age", "{not json"], "argument args: a JSON object"),
        (["enqueue", "caches", "caches.Age", "[1, 2]"], "argument args: a JSON object, got list"),
        (
            ["enqueue", "caches", "caches.Age", "--run-at", "2030-01-01T00:00"],
            "argument --run-at: an ISO time with a zone",
        ),
        (["enqueue", "caches", "caches.Age", "--run-at", "tomorrow"], "argument --run-at: an ISO time with a zone"),
        (["enqueue", "caches", "caches.Age", "--priority", "1.5"], "argument --priority: a whole number"),
        (["enqueue", "caches", "caches.Age", "--priority", str(2**31)], "argument --priority: a priority within"),
        (["cancel"], "the following arguments are required: ID"),
        (["cancel", "1", "x"], "argument ID: a job id"),
        (["status", "--verbose"], "unrecognized arguments: --verbose"),
    ],
)
def test_a_bad_argument_is_a_message_and_exit_code_2(db, cli, argv, message):
    code, out, err = cli(*argv)
    assert code == 2, out + err
    assert message in err, err
    assert "Traceback" not in err


def test_bad_arguments_exit_2_from_a_real_process(database_url):
    env = {**os.environ, "DATABASE_URL": database_url}
    for argv in (["failed", "--since", "1y"], ["enqueue", "nowhere", "x.Y"]):
        done = subprocess.run(
            [sys.executable, "worker.py", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2, done.stdout + done.stderr
        assert done.stderr.strip() and "Traceback" not in done.stderr


@pytest.mark.parametrize("command", ["status", "failed", "show", "redrive", "retry", "enqueue", "cancel", "db-url"])
def test_every_command_has_help(cli, command):
    code, out, _ = cli(command, "--help")
    assert code == 0 and out.startswith("usage:") and "--json" in out


def test_redrive_says_why_a_job_asked_for_is_not_redriven(db, cli):
    """A fail: job is an answer, not a fault: redrive leaves it and says so,
    as it does for a job that is not failed or does not exist."""
    answered = _job(db, status="fail: no such repo", n=1)
    waiting = _job(db, n=2)
    code, out, _ = cli("redrive", "--id", str(answered), str(waiting), "999999")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "redrove 0 jobs"
    assert f"  {answered}: it ended 'fail: no such repo'; fail: and skip: are answers" in out
    assert f"  {waiting}: it is pending, not failed" in lines
    assert "  999999: no such job" in lines
    _, nothing, _ = cli("redrive", "--queue", "caches")
    assert "no err: job matches; fail: and skip: are answers" in nothing


# scale


def test_scale_sets_a_queue_concurrency_within_its_definition(db, cli):
    limit = next(q.concurrency for q in defined(REGISTRY, db) if q.name == "caches")
    code, out, err = cli("scale", "caches", "1")
    assert code == 0, err
    assert "caches runs 1 at a time" in out
    to, by = db.query_row("SELECT scaled_to, scaled_by FROM job_queues WHERE queue = 'caches'")
    assert to == 1 and by.startswith("cli ") and "@" in by
    code, _, err = cli("scale", "caches", str(limit + 1))
    assert code == 2 and f"runs at most {limit} at once" in err
    assert db.query_row("SELECT scaled_to FROM job_queues WHERE queue = 'caches'") == (1,)
    code, _, err = cli("scale", "cachez", "1")
    assert code == 2 and "caches" in err  # the nearest known name
    code, _, err = cli("scale", "caches", "0")
    assert code == 2 and "at least 1" in err
    code, out, err = cli("scale", "caches", "default")
    assert code == 0, err
    assert db.query_row("SELECT scaled_to FROM job_queues WHERE queue = 'caches'") == (None,)


def test_status_counts_waiting_jobs_and_show_names_what_a_job_waits_for(db, cli):
    dep = insert(db, "caches", "caches.Refresh", {"n": 1})
    waiting = insert(db, "caches", "caches.Refresh", {"n": 2}, after=[dep])
    code, out, err = cli("status")
    assert code == 0, err
    [caches] = [r for r in _lines(out) if r[0] == "caches"]
    assert caches[1:4] == ["2", "1", "1 (1 waiting)"]
    code, out, err = cli("show", str(waiting))
    assert code == 0, err
    assert f"waits for: {dep} (pending)" in out.splitlines()
    code, out, err = cli("show", str(dep))
    assert f"waited for by: {waiting} (pending)" in out.splitlines()
