import pytest

from lib import status as st
from lib.sql import Q


def test_builders_and_reader_agree():
    assert st.kind(st.ok()) is st.Kind.OK
    assert st.kind(st.ok("3 rows")) is st.Kind.OK
    assert st.kind(st.fail("no match")) is st.Kind.FAIL
    assert st.kind(st.skip("nothing new")) is st.Kind.SKIP
    assert st.kind(st.err("boom")) is st.Kind.ERR
    assert st.kind(st.INTERRUPTED) is st.Kind.ERR
    assert st.kind("pending") is st.Kind.PENDING
    assert st.detail(st.fail("no  match\n here")) == "no match here"


@pytest.mark.parametrize("bad", ["", "done", "error: x", "fail:", "fail: ", "OK", "err:x"])
def test_reader_refuses_what_is_not_a_status(bad):
    with pytest.raises(ValueError):
        st.kind(bad)


def test_a_reason_is_required_and_length_is_bounded():
    with pytest.raises(ValueError):
        st.fail("  ")
    assert len(st.err("x" * 10_000)) == st.MAX_LEN


def test_every_status_the_sql_writes_parses():
    # The literal statuses in the named queries and migrations must be in the vocabulary.
    import re

    from lib.sql import SQL_DIR

    texts = [*(getattr(Q, n) for n in Q.names()), *(p.read_text() for p in (SQL_DIR / "migrations").glob("*.sql"))]
    literals = set()
    for text in texts:
        for match in re.finditer(r"status\s*(?:=|<>|IN\s*\(|THEN|ELSE)\s*'([^']+)'", text):
            literals.add(match.group(1))
        literals.update(re.findall(r"(?:THEN|ELSE) '([^']+)'", text))
    assert {"pending", "started", "err: interrupted"} <= literals
    for literal in literals:
        st.kind(literal)


def test_counts_use_the_reader(db):
    from lib.insert import insert

    for s in ["ok", "ok: 2", "fail: no", "skip: none", "err: boom", "err: interrupted"]:
        job_id = insert(db, "q", "q.X")
        db.exec("UPDATE jobs SET status = %s WHERE id = %s", (s, job_id))
    kinds = [st.kind(s) for (s,) in db.query("SELECT status FROM jobs")]
    assert kinds.count(st.Kind.OK) == 2 and kinds.count(st.Kind.ERR) == 2
