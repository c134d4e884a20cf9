"""bench/compare.py's peers' interpreter: one not built yet reads as lacking
the peers, so that the benchmark builds its virtualenv instead of failing."""

import sys

from bench.compare import peer_versions


def test_an_interpreter_not_built_yet_has_no_peers(tmp_path):
    assert peer_versions(str(tmp_path / ".venv-peers" / "bin" / "python")) is None


def test_an_interpreter_without_the_peers_has_none(tmp_path):
    # This one runs, but holds none of the peers (the project's own requirements).
    assert peer_versions(sys.executable) is None
