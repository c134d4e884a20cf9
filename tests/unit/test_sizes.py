"""lib/ stays in pieces a reader takes in at once: no module over 400 lines,
no class over 250, and at most 12 entries at its top level (sub-packages by
concern, and the modules applications import). A module that grows past its
bound is split by concern, not given a higher bound."""

from __future__ import annotations

import ast

from tests_support import ROOT

LIB = ROOT / "lib"
MODULE_LINES = 400
CLASS_LINES = 250
TOP_LEVEL_ENTRIES = 12


def modules():
    return sorted(p for p in LIB.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_module_of_lib_is_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in modules() if (n := len(p.read_text().splitlines())) > MODULE_LINES}
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
