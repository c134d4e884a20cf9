"""How a migration in steps is read (lib/store/migration_steps.py), and the
forms refused because a run stopped midway could not safely run them again."""

import pytest

from lib.store.migrate import migrations
from lib.store.migration_steps import Kind, Step, check_one_transaction, in_steps, read_steps

HEADER = "-- migrate: in steps\n-- Why it is shaped so.\n\n"


def test_every_migration_reads():
    for _, name, path in migrations():
        text = path.read_text()
        if in_steps(text):
            assert read_steps(text, name)
        else:
            check_one_transaction(text, name)


def test_each_step_is_run_as_its_statements_require():
    text = HEADER + (
        "-- step: a column\nALTER TABLE t ADD COLUMN c int;\nALTER TABLE t ADD COLUMN d int;\n\n"
        "-- step, in batches over t: c filled in\n"
        "UPDATE t SET c = 1 WHERE ctid >= %(from_tid)s::tid AND ctid < %(to_tid)s::tid AND c IS NULL;\n\n"
        "-- step: an index\n-- Why this index.\nCREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS t_c ON t (c);\n\n"
        "-- step: checked\nALTER TABLE t VALIDATE CONSTRAINT t_c_set;\n\n"
        "-- step: an old index gone\nDROP INDEX CONCURRENTLY IF EXISTS t_old;\n"
    )
    assert [(s.number, s.kind, s.table, s.index) for s in read_steps(text, "x")] == [
        (1, Kind.TRANSACTION, None, None),
        (2, Kind.BATCHES, "t", None),
        (3, Kind.ALONE, None, "t_c"),
        (4, Kind.ALONE, None, None),
        (5, Kind.ALONE, None, None),
    ]
    assert read_steps(text, "x")[2] == Step(
        3, "an index", "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS t_c ON t (c);", Kind.ALONE, index="t_c"
    )


@pytest.mark.parametrize(
    ("body", "refusal"),
    [
        ("ALTER TABLE t ADD COLUMN c int;\n-- step: x\nSELECT 1;\n", "only comments come before the first step"),
        ("-- step: x\n-- a comment only\n", "has no statement"),
        ("-- step: x\nCREATE INDEX CONCURRENTLY t_c ON t (c);\n", "IF NOT EXISTS"),
        ("-- step: x\nDROP INDEX CONCURRENTLY t_c;\n", "IF EXISTS"),
        ("-- step: x\nSELECT 1;\nCREATE INDEX CONCURRENTLY IF NOT EXISTS t_c ON t (c);\n", "a step of its own"),
        ("-- step: x\nCREATE INDEX CONCURRENTLY IF NOT EXISTS t_c ON t (c);\nSELECT 1;\n", "one statement"),
        ("-- step, in batches over t: x\nUPDATE t SET c = 1 WHERE c IS NULL;\n", "%(from_tid)s"),
        ("", "at least one"),
    ],
)
def test_a_step_that_could_not_be_run_again_is_refused(body, refusal):
    with pytest.raises(ValueError, match=refusal.replace("(", r"\(").replace(")", r"\)")):
        read_steps(HEADER + body, "x")


def test_a_migration_in_one_transaction_holds_no_concurrently_statement():
    with pytest.raises(ValueError, match="needs a migration in steps"):
        check_one_transaction("CREATE INDEX CONCURRENTLY IF NOT EXISTS t_c ON t (c);\n", "x")
