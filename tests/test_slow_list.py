"""tests/slow.py names tests that exist: a renamed test would silently leave the slow tier
and make `make test-fast` slower, so the table follows the code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from slow import SLOW

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted(SLOW))
def test_every_slow_test_named_exists(path):
    assert (ROOT / path).is_file(), f"tests/slow.py names {path}, which is gone"
    tree = ast.parse((ROOT / path).read_text())
    defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    missing = sorted(set(SLOW[path]) - defined)
    assert not missing, f"tests/slow.py names tests that {path} no longer defines: {missing}"
