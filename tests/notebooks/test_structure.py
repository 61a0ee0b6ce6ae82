"""Every notebook reads the same way: sections numbered 1, 2, 3, ... in order, and the summary
("What this notebook showed (checked)", with the cell that asserts it) last, after the
exercises, so that Run All ends on the checks and a learner finds the summary where the
notebook ends. No kernel: the committed notebooks' markdown is read."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
SECTION = re.compile(r"^## (?:(?P<number>\S+)\. )?(?P<title>.+)$")
SUMMARY_TITLE = "What this notebook showed (checked)"


def sections(path: Path) -> list[tuple[int, str | None, str]]:
    """(cell index, number or None, title) of each level-2 heading, in order."""
    found = []
    for index, cell in enumerate(nbformat.read(path, as_version=4).cells):
        if cell.cell_type != "markdown":
            continue
        in_code = False
        for line in cell.source.splitlines():
            in_code ^= line.startswith("```")
            match = None if in_code else SECTION.match(line)
            if match:
                found.append((index, match["number"], match["title"]))
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_sections_are_numbered_one_by_one(path: Path):
    numbers = [number for _, number, _ in sections(path) if number is not None]
    assert numbers == [str(n) for n in range(1, len(numbers) + 1)], (
        f"{path.name}: sections numbered {numbers}; number them 1, 2, 3, ... in order "
        "(an exercise's heading has no number; a part of a section is a ### heading)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_summary_is_the_last_section(path: Path):
    found = sections(path)
    titles = [title for _, _, title in found]
    assert SUMMARY_TITLE in titles, f"{path.name} has no '## N. {SUMMARY_TITLE}' section"
    index, number, title = found[-1]
    assert title == SUMMARY_TITLE, (
        f"{path.name}: the last section is {title!r} (cell {index}); the summary and its "
        "checks come last, after the exercises")
    numbered = [n for _, n, _ in found if n is not None]
    assert number == (numbered[-1] if numbered else None)


def test_sections_reads_headings_not_code_blocks(tmp_path: Path):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("## 1. One\n```\n## 3. not a heading\n```"),
        nbformat.v4.new_code_cell("## 2. a comment"),
        nbformat.v4.new_markdown_cell("## Exercise\n### part\n## 2. Two"),
    ])
    path = tmp_path / "n.ipynb"
    nbformat.write(nb, path)
    assert sections(path) == [(0, "1", "One"), (2, None, "Exercise"), (2, "2", "Two")]
