"""lib/ stays in pieces a reader takes in at once: no module over 400 lines,
no class over 250, and at most 12 entries at its top level (sub-packages by
concern, and the modules applications import). The bounds are guidance: a
module that grows past 400 lines for one concern says why in its docstring,
in a paragraph that starts "Over 400 lines:", rather than spreading that
concern across files; one that holds several concerns is split by them."""

from __future__ import annotations

import ast
from pathlib import Path

from tests_support import ROOT

LIB = ROOT / "lib"
MODULE_LINES = 400
CLASS_LINES = 250
TOP_LEVEL_ENTRIES = 12


def modules() -> list[Path]:
    return sorted(p for p in LIB.rglob("*.py") if "__pycache__" not in p.parts)


# How a module's docstring says why it is over MODULE_LINES.
OVER_BOUND = f"Over {MODULE_LINES} lines:"


def says_why_it_is_long(path: Path) -> bool:
    """Whether the module's docstring has a paragraph that starts OVER_BOUND
    and goes on to give a reason."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return any(
        part.startswith(OVER_BOUND) and part.removeprefix(OVER_BOUND).strip()
        for part in (" ".join(p.split()) for p in doc.split("\n\n"))
    )


def test_no_module_of_lib_is_over_400_lines():
    """Unless its docstring says why."""
    long = {
        str(p.relative_to(ROOT)): n
        for p in modules()
        if (n := len(p.read_text().splitlines())) > MODULE_LINES and not says_why_it_is_long(p)
    }
    assert not long


def test_no_class_of_lib_is_over_250_lines():
    long = {
        f"{p.relative_to(ROOT)}:{node.lineno} {node.name}": size
        for p in modules()
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ClassDef) and (size := node.end_lineno - node.lineno + 1) > CLASS_LINES
    }
    assert not long


def test_the_top_level_of_lib_holds_at_most_12_entries():
    entries = sorted(p.name for p in LIB.iterdir() if p.name != "__pycache__")
    assert len(entries) <= TOP_LEVEL_ENTRIES, entries
