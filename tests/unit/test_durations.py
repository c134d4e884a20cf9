"""The one reading of a duration an operator types, shared by the CLI's
--since and the admin page's ages (lib/setup/parsers.py's duration): what it
takes, and what it refuses, with the same words in both places."""

import pytest

from lib.setup.parsers import MAX_DURATION_DAYS, duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("15m", 900),
        ("1.5h", 5400),
        (" 7 d ", 7 * 86400),
        (f"{MAX_DURATION_DAYS}d", MAX_DURATION_DAYS * 86400),
    ],
)
def test_a_duration_as_an_operator_types_it(text, seconds):
    assert duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    ["0m", f"{MAX_DURATION_DAYS + 1}d", "999999d", "9" * 400 + "d", "1y", "-5m", "5", "\u00b2m", "1e3m", "", "m"],
)
def test_a_duration_out_of_range_or_unreadable_is_refused_saying_what_is_wanted(text):
    wanted = f"a duration like 30m, 1h or 2d, above 0 and at most {MAX_DURATION_DAYS}d, got "
    with pytest.raises(ValueError) as refused:
        duration(text)
    assert str(refused.value).startswith(wanted)
    assert len(str(refused.value)) < len(wanted) + 60  # a long slip is not echoed whole
