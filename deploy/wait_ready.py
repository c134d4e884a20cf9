"""Wait until the worker's /readyz answers 200, for systemd's ExecStartPost
(deploy/jobs-worker.service): `systemctl start` and `restart` return once the
worker is ready, or fail with /readyz's last one-line reason. The address is
JOBS_HTTP_ADDR, read as the worker reads it. Standard library only."""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lib.setup.parsers import SettingError, http_addr

# An address that listens everywhere is asked on loopback.
_LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds to wait (default %(default)s)")
    args = parser.parse_args(argv)
    try:
        addr = http_addr(os.environ.get("JOBS_HTTP_ADDR"))
    except SettingError as exc:
        print(f"wait_ready: {exc}", file=sys.stderr)
        return 2
    if addr is None:
        print("wait_ready: JOBS_HTTP_ADDR is off; nothing to wait for")
        return 0
    host = _LOOPBACK.get(addr[0], addr[0])
    url = f"http://{f'[{host}]' if ':' in host else host}:{addr[1]}/readyz"
    deadline = time.monotonic() + args.timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                print(f"wait_ready: {answer.read().decode().strip()}")
                return 0
        except urllib.error.HTTPError as exc:  # 503 and its reason
            reason = exc.read().decode(errors="replace").strip() or str(exc)
        except OSError as exc:  # not listening yet (still connecting to the database, say)
            reason = f"no answer from {url}: {exc}"
        if time.monotonic() >= deadline:
            print(f"wait_ready: not ready after {args.timeout:g}s: {reason}", file=sys.stderr)
            return 1
        time.sleep(1.0)


if __name__ == "__main__":
    sys.exit(main())
