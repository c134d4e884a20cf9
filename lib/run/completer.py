"""What the write and claim stages hand their asks to: an outcome to write,
a claim to make, or both in one round trip and one commit. The process's
group commit (lib/store/group_commit.py, Committer) is one."""

from __future__ import annotations

from typing import Any, Protocol

from lib.store.group_commit import Reply


class Completer(Protocol):
    def send(self, outcome: dict[str, Any] | None, claim: dict[str, Any] | None) -> Reply:
        """job_finalize's and job_claim's parameters (either may be None);
        what the server answered. Raises what the round trip raised."""
        ...
