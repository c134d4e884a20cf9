"""The admin page's SVG charts of job_minutes: buckets from rows, bars and
lines in proportion, gaps where no minute was rolled up, and every text escaped."""

import re
from datetime import UTC, datetime, timedelta

from lib.http.charts import HEIGHT, buckets, finished_chart, line_chart

T = datetime(2026, 6, 1, 10, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def row(m: int, ok=0, fail=0, skip=0, err=0, p50=None, p95=None, backlog=None):
    return (T + m * MINUTE, ok, fail, skip, err, p50, p95, backlog)


def test_minutes_fall_into_their_buckets_and_the_window_keeps_empty_ones():
    rows = [row(0, ok=2, p50=1.0, p95=3.0, backlog=5), row(1, ok=1, err=1, p50=2.0, p95=9.0), row(25, fail=4)]
    data = buckets([*rows, row(-1, ok=100), row(30, ok=100)], T, T + 30 * MINUTE, 10 * MINUTE)
    assert [b.start for b in data] == [T, T + 10 * MINUTE, T + 20 * MINUTE]
    assert data[0].counts == {"ok": 3, "fail": 0, "skip": 0, "err": 1}
    assert (data[0].latency_p95, data[0].backlog) == (9.0, 5)
    assert data[1].counts == {"ok": 0, "fail": 0, "skip": 0, "err": 0} and data[1].latency_p50 is None
    assert data[2].counts["fail"] == 4


def heights(svg: str, colour: str) -> list[float]:
    return [float(h) for h in re.findall(rf'height="([\d.]+)" fill="{colour}"', svg)]


def test_bars_stack_each_kind_in_proportion_to_the_busiest_bucket():
    data = buckets([row(0, ok=3, err=1), row(1, ok=2)], T, T + 2 * MINUTE, MINUTE)
    svg = finished_chart(data, "all queues, last hour")
    assert heights(svg, "#2e7d32") == [HEIGHT * 3 / 4, HEIGHT * 2 / 4]
    assert heights(svg, "#c62828") == [HEIGHT * 1 / 4]
    assert "at most 4 a bucket" in svg
    assert "<title>10:00: 3 ok, 0 fail, 0 skip, 1 err</title>" in svg


def test_an_empty_window_draws_no_bars_and_no_division_by_zero():
    data = buckets([], T, T + 60 * MINUTE, MINUTE)
    assert len(data) == 60
    assert "<rect" not in finished_chart(data, "x")
    assert "<polyline" not in line_chart(data, "x", {"latency_p95": "#000"}, "s")


def test_a_line_breaks_where_a_bucket_has_no_value_and_a_lone_value_is_a_dot():
    data = buckets([row(0, p95=1.0), row(1, p95=2.0), row(3, p95=4.0)], T, T + 4 * MINUTE, MINUTE)
    svg = line_chart(data, "latency", {"latency_p95": "#000"}, "s")
    assert svg.count("<polyline") == 1 and svg.count("<circle") == 1
    assert 'cy="0.00"' in svg  # the lone 4 s is the top of the chart
    assert "at most 4 s" in svg


def test_labels_are_escaped():
    data = buckets([row(0, ok=1)], T, T + MINUTE, MINUTE)
    svg = finished_chart(data, '<script>alert(1)</script>"')
    assert "<script>" not in svg and "&lt;script&gt;" in svg
