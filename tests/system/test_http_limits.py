"""The HTTP side cannot starve the worker: slow and idle clients are cut off,
open connections are capped below the worker's open-files limit, and a
failing accept is one log line, not one per try."""

import logging
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import gevent
import pytest
import requests
from gevent.event import Event
from gevent.pool import Pool
from http_support import free_port
from tests_support import PROBE_WORKER, ROOT, wait_for

from lib.http import metrics
from lib.http.httpd import HttpServer, make_app
from lib.insert import insert

HALF_HEAD = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"  # the blank line that ends a head never comes
# systemd's default soft limit, which a unit without LimitNOFILE runs under.
SYSTEMD_DEFAULT_NOFILE = 1024
ATTACKERS = 1200


@pytest.fixture
def probe_db(db):
    db.exec("DROP TABLE IF EXISTS probe_runs")
    db.exec("CREATE TABLE probe_runs (job_id bigint, event text, at timestamptz DEFAULT clock_timestamp())")
    return db


@pytest.fixture
def many_files() -> Iterator[None]:
    """This process opens more sockets than a default soft limit allows: the
    soft limit goes up to the hard one for the test, and back after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = ATTACKERS + 500
    raised = wanted if hard == resource.RLIM_INFINITY else min(hard, max(soft, wanted))
    assert raised >= wanted, f"the hard open-files limit ({hard}) is below what the test needs ({wanted})"
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, raised), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class Pages:
    """/healthz answers at once; /readyz waits until released."""

    def __init__(self) -> None:
        self.release = Event()

    def alive(self) -> tuple[bool, str]:
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        self.release.wait(30)
        return True, "ready"


@contextmanager
def serving(pages: Pages | None = None, **options) -> Iterator[HttpServer]:
    """The worker's server on a free loopback port, in this process."""
    server = HttpServer(("127.0.0.1", 0), make_app(pages or Pages(), metrics.registry()), **options)  # type: ignore[arg-type]
    part = gevent.spawn(server.serve, Event())
    try:
        assert server.serving.wait(10), "the server did not start"
        yield server
    finally:
        part.kill()


def connect(server: HttpServer, head: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    if head:
        sock.sendall(head)
    return sock


def closed_within(sock: socket.socket, seconds: float) -> float:
    """How long the server took to close sock (reading what it sent first), at most seconds."""
    started = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        raise AssertionError(f"still open after {seconds}s") from None
    except ConnectionResetError:
        pass  # closed with bytes of ours unread: a reset, closed all the same
    return time.monotonic() - started


def test_a_client_that_sends_half_a_head_and_stops_is_disconnected_after_the_head_timeout():
    with serving(head_timeout=0.5) as server:
        with connect(server, HALF_HEAD) as sock:
            waited = closed_within(sock, 5)
        assert 0.4 <= waited < 3, waited


def test_a_head_sent_a_byte_at_a_time_is_cut_off_at_its_deadline_not_per_byte():
    """Each byte comes well within the head timeout: only a deadline on the
    whole head ends it."""
    with serving(head_timeout=0.5) as server, connect(server) as sock:
        started = time.monotonic()
        with suppress(OSError):  # the server closes while bytes still come
            for byte in HALF_HEAD * 10:
                sock.sendall(bytes([byte]))
                gevent.sleep(0.05)
        assert time.monotonic() - started < 5  # it was cut off before the bytes ran out
        closed_within(sock, 3)


def test_an_idle_kept_alive_connection_is_closed_after_the_head_timeout():
    with serving(head_timeout=0.5) as server, connect(server) as sock:
        for _ in range(2):  # kept alive between requests
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200 OK\r\n")
        waited = closed_within(sock, 5)
        assert 0.4 <= waited < 3, waited


def test_at_the_cap_a_new_connection_takes_the_place_of_the_longest_waiting_for_a_head():
    with serving(head_timeout=60, max_connections=3) as server:
        idle = [connect(server, HALF_HEAD) for _ in range(3)]
        try:
            wait_for(lambda: server.waiting_for_head == 3, 10)
            answer = requests.get(f"http://127.0.0.1:{server.port}/healthz", timeout=5)
            assert (answer.status_code, answer.text) == (200, "ok\n")
            closed_within(idle[0], 5)
            for sock in idle[1:]:
                sock.settimeout(0.2)
                with pytest.raises(TimeoutError):
                    sock.recv(1)
        finally:
            for sock in idle:
                sock.close()


def test_at_the_cap_with_every_connection_in_a_request_a_new_one_is_closed_at_once():
    pages = Pages()
    with serving(pages, max_connections=2) as server:
        base = f"http://127.0.0.1:{server.port}"
        busy = [gevent.spawn(requests.get, f"{base}/readyz", timeout=30) for _ in range(2)]
        try:
            wait_for(lambda: server.open_connections == 2 and server.waiting_for_head == 0, 10)
            with connect(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n") as sock:
                assert closed_within(sock, 5) < 3
            pages.release.set()
            assert [g.get(timeout=10).status_code for g in busy] == [200, 200]
        finally:
            pages.release.set()
            gevent.killall(busy)


def test_accepts_out_of_descriptors_are_one_log_line_pause_and_serve_once_they_are_back(caplog):
    """EMFILE leaves the connection queued and the listener readable: the
    accepts must pause, not spin, and say so once, not once per try."""
    with serving() as server, socket.socket() as client, caplog.at_level(logging.WARNING, logger="jobs"):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        held: list[int] = []
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 20, hard))
            with suppress(OSError):
                while True:
                    held.append(os.open(os.devnull, os.O_RDONLY))
            client.connect(("127.0.0.1", server.port))  # the kernel's; the server's accept fails
            client.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            wait_for(lambda: emfile_lines(caplog.text), 10)
            before = resource.getrusage(resource.RUSAGE_SELF)
            gevent.sleep(1.5)  # a window to measure, not a wait for anything
            after = resource.getrusage(resource.RUSAGE_SELF)
        finally:
            for fd in held:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        client.settimeout(10)
        assert client.recv(4096).startswith(b"HTTP/1.1 200 OK\r\n")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 0.5, f"{cpu:.2f}s of CPU in 1.5s without a descriptor"
    assert len(emfile_lines(caplog.text)) == 1, caplog.text


def _limit_files(n: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

    return apply


@contextmanager
def worker_with_files(database_url: str, log: Path, nofile: int) -> Iterator[tuple[subprocess.Popen, int]]:
    """A real worker process serving HTTP, its open-files limit nofile, its
    output in log (a file: a pipe nobody reads would stall it); it and its port."""
    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(PROBE_WORKER)],
            cwd=ROOT,
            env={
                **os.environ,
                "DATABASE_URL": database_url,
                "JOBS_HTTP_ADDR": f"127.0.0.1:{port}",
                "LOG_LEVEL": "INFO",
                "SENTRY_DSN": "",
            },
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_limit_files(nofile),
        )
    try:
        wait_for(lambda: _healthz(port, timeout=2) == 200, 30)
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _healthz(port: int, timeout: float) -> int | None:
    try:
        return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=timeout).status_code
    except requests.RequestException:
        return None


def open_half_sent(port: int, n: int) -> list[socket.socket]:
    """n connections that each send half a request head and then nothing,
    never closing; the ones that connected within 10 s."""
    opened: list[socket.socket] = []

    def one() -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        except OSError:
            return
        opened.append(sock)
        # A server that has already closed this one (its choice) may refuse the bytes.
        with suppress(OSError):
            sock.sendall(HALF_HEAD)

    connectors = Pool(50)
    for _ in range(n):
        connectors.spawn(one)
    connectors.join(timeout=60)
    connectors.kill()
    return opened


def emfile_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "Too many open files" in line or "EMFILE" in line]


def test_a_worker_at_1024_files_serves_healthz_and_runs_jobs_under_1200_half_sent_requests(
    probe_db, database_url, many_files, tmp_path
):
    log = tmp_path / "worker.log"
    with worker_with_files(database_url, log, SYSTEMD_DEFAULT_NOFILE) as (proc, port):
        sockets = open_half_sent(port, ATTACKERS)
        try:
            assert len(sockets) == ATTACKERS, f"{len(sockets)} of {ATTACKERS} connected"
            started = time.monotonic()
            assert _healthz(port, timeout=3) == 200, "/healthz did not answer within 3s"
            assert time.monotonic() - started < 3
            in_use = len(os.listdir(f"/proc/{proc.pid}/fd"))
            assert in_use < SYSTEMD_DEFAULT_NOFILE - 256, f"the worker holds {in_use} descriptors"
            # The pool's idle connections end, so the job's claim and the
            # handler's statements must open new ones while the sockets are held.
            probe_db.exec(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = 'jobs'"
            )
            job_id = insert(probe_db, "probe", "probe.Sleep", {"seconds": 0})
            wait_for(lambda: probe_db.query_row("SELECT status FROM jobs WHERE id = %s", (job_id,))[0] == "ok", 20)
        finally:
            for sock in sockets:
                sock.close()
    output = log.read_text()
    assert len(emfile_lines(output)) <= 2, "\n".join(emfile_lines(output)[:5])
