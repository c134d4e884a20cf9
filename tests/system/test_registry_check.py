import os
import subprocess
import sys
from pathlib import Path

import pytest

from lib.background.clock import Scheduled, every
from lib.operate.enqueue_sites import Writer
from lib.operate.registry_check import check, main
from lib.operate.setup_check import defined, unconnected
from lib.run.queue import Queue
from lib.setup.parsers import SettingError
from lib.store.db import DB
from queues import REGISTRY
from queues.schedule import SCHEDULE

ROOT = Path(__file__).resolve().parents[2]


def _ok(job):
    return "ok"


KNOWN = Queue("known", {"known.Run": _ok, "known.Other": _ok})


def plant(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


PLANTED_PY = """\
from lib.insert import Job, insert, insert_many


def enqueue(db, queue):
    insert(db, "known", "known.Run")
    insert(db, "ghost", "ghost.Nope", {"n": 1})
    insert(db, queue=\"known\", name=\"known.Typo\")
    insert_many(db, [Job("known", "known.Other"), Job("phantom", "phantom.Job")])
    insert(db, queue, "known.Run")
    names.insert(0, "not a job")
"""

PLANTED_SQL = """\
-- name: enqueue_ghosts
-- Enqueue a job for each thing.
INSERT INTO jobs (queue, name, args)
SELECT 'sqlghost', 'sqlghost.Missing', jsonb_build_object('id', t.id) FROM things t

-- name: enqueue_known
-- A handled pair, in VALUES, with a cast.
INSERT INTO jobs (name, queue) VALUES ('known.Run', 'known'::text), ('known.Gone', 'known');

-- name: enqueue_param
-- A parameterized insert: its Python caller names the pair.
INSERT INTO jobs (queue, name) VALUES (%(queue)s, %(name)s)
"""

PLANTED_MIGRATION = """\
CREATE TABLE things (id int);
CREATE FUNCTION things_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO jobs (queue, name, args) VALUES ('trigger', 'trigger.Job', jsonb_build_object('id', NEW.id));
  RETURN NEW;
END $$;
"""


def test_a_planted_tree_fails_naming_each_unhandled_writer(tmp_path, capsys):
    root = plant(
        tmp_path,
        {
            "queues/ghost.py": PLANTED_PY,
            "sql/ghosts.sql": PLANTED_SQL,
            "sql/migrations/009_things.sql": PLANTED_MIGRATION,
            # Not the project's code: never read.
            "tests/test_ghost.py": 'insert(db, "tests", "tests.Only")\n',
            "bench/b.py": 'insert(db, "bench", "bench.Only")\n',
        },
    )
    schedule = [Scheduled("known", "known.Other", every(5)), Scheduled("late", "late.Tick", every(5))]
    report = check([KNOWN], schedule, root)
    assert [(p.split(":")[0], p.split("queue=")[1]) for p in report.problems] == [
        ("queues/ghost.py", "ghost job=ghost.Nope has no worker (no such queue is registered)"),
        ("queues/ghost.py", "known job=known.Typo has no worker (queue known does not handle it)"),
        ("queues/ghost.py", "phantom job=phantom.Job has no worker (no such queue is registered)"),
        ("sql/ghosts.sql", "sqlghost job=sqlghost.Missing has no worker (no such queue is registered)"),
        ("sql/ghosts.sql", "known job=known.Gone has no worker (queue known does not handle it)"),
        ("sql/migrations/009_things.sql", "trigger job=trigger.Job has no worker (no such queue is registered)"),
        ("schedule", "late job=late.Tick has no worker (no such queue is registered)"),
    ]
    lines = {p.split(" ")[0] for p in report.problems}
    assert lines == {
        "queues/ghost.py:6:",
        "queues/ghost.py:7:",
        "queues/ghost.py:8:",
        "sql/ghosts.sql:3:",
        "sql/ghosts.sql:8:",
        "sql/migrations/009_things.sql:4:",
        "schedule:",
    }
    assert report.warnings == [
        "queues/ghost.py:9: queue is not a string literal in insert(db, queue, 'known.Run'); not checked"
    ]
    assert Writer("queues/ghost.py:5", "known", "known.Run") in report.writers
    assert Writer("sql/ghosts.sql:8", "known", "known.Run") in report.writers

    assert main([KNOWN], schedule, root) == 1
    out = capsys.readouterr().out
    assert "queues/ghost.py:6: queue=ghost job=ghost.Nope" in out
    assert "sql/ghosts.sql:3: queue=sqlghost job=sqlghost.Missing" in out
    assert out.strip().endswith("registry check failed: 7 problem(s)")


def test_a_handled_tree_passes(tmp_path, capsys):
    root = plant(
        tmp_path,
        {
            "worker.py": 'insert(db, "known", "known.Run")\n',
            "lib/x.py": "import lib.insert as jobs\n\njobs.insert(db, 'known', name='known.Other')\n",
            "sql/x.sql": "INSERT INTO jobs (queue, name) SELECT 'known' AS queue, 'known.Run' AS name;\n",
        },
    )
    report = check([KNOWN], [Scheduled("known", "known.Run", every(5))], root)
    assert report.problems == [] and report.warnings == []
    assert len(report.writers) == 4
    assert main([KNOWN], [], root) == 0
    assert capsys.readouterr().out == "registry check ok: 3 writers name 2 jobs, all handled by 1 queues\n"


def test_a_call_marked_as_checked_at_run_time_is_not_a_warning(tmp_path):
    marked = "insert(db, args.queue, args.name)  # registry-check: names checked at run time\n"
    root = plant(tmp_path, {"lib/a.py": marked, "lib/b.py": "insert(db, args.queue, args.name)\n"})
    report = check([KNOWN], [], root)
    assert report.problems == [] and [w.split(":")[0] for w in report.warnings] == ["lib/b.py"]


def test_an_aliased_enqueue_is_read_and_a_local_definition_is_not(tmp_path):
    root = plant(
        tmp_path,
        {
            "lib/a.py": "from lib.insert import insert as enqueue\n\nenqueue(db, 'ghost', 'ghost.Aliased')\n",
            # A module that defines its own insert (as lib/insert.py does) is not a writer.
            "lib/b.py": "def insert(db, queue, name):\n    pass\n\ninsert(db, 'ghost', 'ghost.Local')\n",
        },
    )
    report = check([KNOWN], [], root)
    assert report.problems == ["lib/a.py:3: queue=ghost job=ghost.Aliased has no worker (no such queue is registered)"]


def test_a_registry_that_cannot_be_built_or_repeats_a_queue_is_a_problem(tmp_path):
    def broken(db: DB) -> Queue:
        raise RuntimeError("no config")

    with pytest.raises(SettingError, match="broken cannot build its queue: RuntimeError: no config"):
        defined([lambda db: KNOWN, broken], unconnected())
    report = check([KNOWN, KNOWN], [], tmp_path)
    assert report.problems == ["REGISTRY[1]: queue 'known' is registered twice"]


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO jobs VALUES (1, 'ghost', 'ghost.X')",  # no column list
        "INSERT INTO jobs (queue, name) SELECT queue, name FROM elsewhere",  # from data
    ],
)
def test_sql_it_cannot_read_is_a_warning(tmp_path, sql):
    report = check([KNOWN], [], plant(tmp_path, {"sql/w.sql": sql}))
    assert report.problems == [] and len(report.warnings) == 1
    assert report.warnings[0].startswith("sql/w.sql:1: ")


def test_the_real_tree_passes(capsys):
    """Every insert call, SQL file and schedule entry of the project names a job
    that a registered worker handles."""
    report = check(defined(REGISTRY, unconnected()), SCHEDULE, ROOT)
    assert report.problems == []
    assert {"caches", "maintenance"} <= set(report.handled)
    assert {("caches", "caches.Age"), ("maintenance", "maintenance.CleanUpJobs")} <= {
        (w.queue, w.name) for w in report.writers
    }
    assert main(defined(REGISTRY, unconnected()), SCHEDULE, ROOT) == 0
    assert capsys.readouterr().out.startswith("registry check ok: ")


@pytest.mark.parametrize(
    ("sql", "writers"),
    [
        pytest.param(
            "WITH things AS (SELECT 1)\nINSERT INTO jobs (queue, name) SELECT 'ghost', 'ghost.Cte' FROM things",
            [(2, "ghost", "ghost.Cte")],
            id="with-insert",
        ),
        pytest.param(
            "WITH job AS (\n  INSERT INTO jobs (queue, name) VALUES ('ghost', 'ghost.InCte') RETURNING id\n)\nSELECT id FROM job",
            [(2, "ghost", "ghost.InCte")],
            id="insert-in-cte",
        ),
        pytest.param(
            "SELECT $fake$INSERT INTO jobs (queue, name) VALUES ('ghost', 'ghost.Fake')$fake$;\n"
            "INSERT INTO jobs (queue, name) VALUES ($$ghost$$, $n$ghost.Dollar$n$)",
            [(2, "ghost", "ghost.Dollar")],
            id="dollar-quoted",
        ),
        pytest.param(
            "-- INSERT INTO jobs (queue, name) VALUES ('ghost', 'ghost.Line');\n"
            "/* outer /* nested */ INSERT INTO jobs (queue, name) VALUES ('ghost', 'ghost.Nested') */\n"
            "INSERT INTO jobs (queue, name) VALUES ('known' /* , 'ghost.Inline' */, 'known.Run')",
            [(3, "known", "known.Run")],
            id="comments",
        ),
        pytest.param(
            'INSERT INTO "jobs" AS j ("name", "queue") VALUES (\'ghost.Quoted\', \'ghost\');\n'
            "INSERT INTO public.jobs (queue, name) VALUES ('ghost', 'ghost.Public');\n"
            # Other tables: a quoted name keeps its case, another schema is another table.
            "INSERT INTO \"Jobs\" (queue, name) VALUES ('ghost', 'ghost.Other');\n"
            "INSERT INTO archive.jobs (queue, name) VALUES ('ghost', 'ghost.Other')",
            [(1, "ghost", "ghost.Quoted"), (2, "ghost", "ghost.Public")],
            id="quoted-identifiers",
        ),
        pytest.param(
            "INSERT INTO jobs (args, name, queue)\n(SELECT jsonb_build_object('id', t.id), 'ghost.Select', 'ghost'::text FROM things t WHERE t.id = %(id)s)",
            [(1, "ghost", "ghost.Select")],
            id="insert-select",
        ),
        pytest.param(
            "INSERT INTO jobs (queue, name) VALUES\n  ('known', 'known.Run'),\n  ('ghost', 'ghost.Row'),\n  (%(queue)s, %(name)s)",
            [(1, "known", "known.Run"), (1, "ghost", "ghost.Row")],
            id="multi-row-values",
        ),
        pytest.param(
            # EXCEPT's right side is never written; E'' and U&'' strings are literals too.
            "INSERT INTO jobs (queue, name)\nSELECT E'ghost', U&'ghost.\\0041' EXCEPT SELECT 'ghost', 'ghost.Never'",
            [(1, "ghost", "ghost.A")],
            id="set-operations-and-escapes",
        ),
        pytest.param(
            # A placeholder right after an operator; the same characters in a string are the string's.
            "SELECT 1 FROM jobs WHERE id=%(id)s;\nINSERT INTO jobs (queue, name) VALUES ('ghost', 'ghost.%(n)s')",
            [(2, "ghost", "ghost.%(n)s")],
            id="placeholders",
        ),
    ],
)
def test_sql_is_read_as_postgres_reads_it(tmp_path, sql, writers):
    report = check([KNOWN], [], plant(tmp_path, {"sql/q.sql": sql}))
    assert report.warnings == []
    assert [(int(w.where.split(":")[1]), w.queue, w.name) for w in report.writers] == writers


PLANTED_PLPGSQL = """\
CREATE FUNCTION enqueue_many(p_queue text) RETURNS SETOF bigint LANGUAGE plpgsql AS $body$
BEGIN
  RAISE NOTICE '%', $msg$INSERT INTO jobs (queue, name) VALUES ('ghost', 'ghost.Notice')$msg$;
  INSERT INTO jobs (queue, name) VALUES (p_queue, 'known.Run');  -- the caller's queue
  RETURN QUERY
    INSERT INTO jobs (queue, name) VALUES ('ghost', 'ghost.Returned') RETURNING id;
END $body$;
DO $$
BEGIN
  INSERT INTO jobs (queue, name) VALUES ('ghost', 'ghost.Do');
END $$;
CREATE FUNCTION enqueue_sql() RETURNS void LANGUAGE sql AS '
  INSERT INTO jobs (queue, name) VALUES (''ghost'', ''ghost.Sql'')';
"""


def test_function_bodies_are_read_as_their_language(tmp_path):
    report = check([KNOWN], [], plant(tmp_path, {"sql/migrations/016_f.sql": PLANTED_PLPGSQL}))
    assert report.warnings == []
    assert [(w.where, w.name) for w in report.writers] == [
        ("sql/migrations/016_f.sql:6", "ghost.Returned"),
        ("sql/migrations/016_f.sql:10", "ghost.Do"),
        ("sql/migrations/016_f.sql:13", "ghost.Sql"),
    ]


@pytest.mark.parametrize(
    ("sql", "problem"),
    [
        pytest.param(
            "SELECT 1;\nINSERT INTO jobs (queue, name) VALUES ('ghost', 'ghost.Unclosed'\n",
            "sql/q.sql:3: cannot be read: syntax error at end of input",
            id="sql",
        ),
        pytest.param(
            "SELECT 1;\nCREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS $$\nBEGIN\n  IF THEN END IF;\nEND $$;\n",
            'sql/q.sql:2: cannot be read: missing expression at or near "THEN"',
            id="plpgsql",
        ),
    ],
)
def test_sql_postgres_cannot_parse_is_a_problem(tmp_path, sql, problem):
    report = check([KNOWN], [], plant(tmp_path, {"sql/q.sql": sql}))
    assert report.problems == [problem]


# What the worker refuses: check fails on it first, and the worker stops with one line, not a traceback.

ELSEWHERE = ROOT / "tests" / "apps" / "elsewhere_worker.py"


@pytest.mark.parametrize(
    ("setup", "line"),
    [
        (
            "duplicate",
            'worker: the schedule lists these jobs more than once: elsewhere.Echo {"text": "nightly"} in queue elsewhere',
        ),
        (
            "every7",
            "worker: schedule (tests/apps/elsewhere_schedule.py:14): ValueError: every(7):"
            " use a divisor of 60, or a multiple of 60 that divides 1440",
        ),
        (
            "badcron",
            "worker: schedule (tests/apps/elsewhere_schedule.py:16): ValueError: cron('0 25 * * *'): Bad hour",
        ),
        (
            "space",
            "worker: __main__.make_elsewhere cannot build its queue: InvalidJob: queue elsewhere:"
            " job name must be a non-empty string without surrounding spaces, got 'elsewhere.Echo '",
        ),
    ],
)
@pytest.mark.parametrize("command", [["check"], []], ids=["check", "worker"])
def test_check_and_the_worker_refuse_a_bad_setup_in_one_line(database_url, setup, line, command):
    done = subprocess.run(
        [sys.executable, str(ELSEWHERE), *command],
        env={**os.environ, "DATABASE_URL": database_url, "LOG_LEVEL": "INFO", "ELSEWHERE_SETUP": setup},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout, done.stderr) == (2, "", line + "\n")


def test_the_same_app_without_its_mistake_passes_check(database_url):
    done = subprocess.run(
        [sys.executable, str(ELSEWHERE), "check"],
        env={**os.environ, "DATABASE_URL": database_url, "ELSEWHERE_SETUP": "ok"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("registry check ok: ")
