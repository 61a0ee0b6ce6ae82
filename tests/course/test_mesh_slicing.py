"""Notebook 11: mesh slices, a flattened mesh and a mesh from a group hold the right ranks."""

from __future__ import annotations

import pytest

import ddp_lab
from ddp_lab.course.ch11_meshes import mesh_slicing

pytestmark = pytest.mark.timeout(120)


def test_slices_flatten_and_from_group_hold_the_right_ranks():
    groups = ddp_lab.run(mesh_slicing.slices, 4, kwargs={"shape": (2, 2)}, echo=False).values
    assert [g["coordinate"] for g in groups] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [g["dp"] for g in groups] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert [g["cp"] for g in groups] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert all(g["flat"] == [0, 1, 2, 3] for g in groups)
    assert [g.get("from_group") for g in groups] == [[0, 2], None, [0, 2], None]
