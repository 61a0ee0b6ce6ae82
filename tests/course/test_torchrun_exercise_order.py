"""Notebook 09: no code cell above the last exercise's check builds per-node groups, so
the answer to `09.node_sum` (one `new_group` per node, made by every rank) and the trap
of the hierarchical all-reduce are not shown before the learner writes them
(docs/reviews/09.md IP-09-6). No kernel: the committed notebook is read."""

from __future__ import annotations

from pathlib import Path

import nbformat

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "09_torchrun_and_multinode.ipynb"
ANSWER_CALLS = ("new_group(", "new_subgroups(", "group=")


def test_no_per_node_group_is_built_above_the_last_exercise_check():
    cells = nbformat.read(NOTEBOOK, as_version=4).cells
    checks = [i for i, c in enumerate(cells)
              if c.cell_type == "code" and 'ex.check("09.' in c.source]
    assert len(checks) == 2, checks
    shown = [(i, call) for i, c in enumerate(cells[:checks[-1] + 1]) if c.cell_type == "code"
             for call in ANSWER_CALLS if call in c.source]
    assert shown == [], f"cells {shown} show the exercises' answer above their checks"
