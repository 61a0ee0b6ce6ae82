"""What the course's front page says about one notebook, read from the notebook itself:
its title, one line on what it teaches, its key figure and its exercises.

Why read it from the notebook and not keep a table of titles and summaries: the notebooks
change every day, and a second copy of what they say would drift. The first heading is the
title, the first sentence of prose is the summary line, and the figure is the one the run
just drew. Pure functions on a notebook node: no kernel, no files written.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass

from ddp_lab.tools.solved import exercise_cells

# A code cell tagged so holds the notebook's key figure; untagged, the last figure drawn is.
KEY_FIGURE_TAG = "key-figure"
SUMMARY_CHARS = 240
SHORT_SENTENCE = 80  # characters: shorter, and the next sentence joins it

HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.+?)\s*#*\s*$")
NOT_PROSE = re.compile(r"^\s*([-*+]\s|>|\||\d+[.)]\s|```|~~~|<|!\[|\$\$)")
LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
# A sentence ends at . ! ? before a space (or the end), unless the dot ends an abbreviation.
SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\bvs)(?<!\bal)(?<!\bcf)[.!?](?=\s|$)")


@dataclass(frozen=True)
class Figure:
    """A PNG the run drew, and the heading of the section it was drawn in (for alt text)."""

    png: bytes
    section: str


def _source(cell) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _markdown_lines(nb):
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            yield from _source(cell).splitlines()
            yield ""  # a cell ends a paragraph


def title(nb, fallback: str) -> str:
    """The first markdown heading's text, or ``fallback`` for a notebook without one."""
    for line in _markdown_lines(nb):
        match = HEADING.match(line)
        if match:
            return _plain(match.group(2))
    return fallback


def summary(nb) -> str:
    """The first sentence of the first prose paragraph, as inline markdown (code spans
    kept), with the next one too while the line stays short (a first sentence such as
    "Notebook 10 sharded the model state." says little); "" when there is no prose."""
    paragraph = _first_prose_paragraph(nb)
    ends = [m.end() for m in SENTENCE_END.finditer(paragraph)]
    cut = ends[0] if ends else len(paragraph)
    for end in ends[1:]:  # whole sentences only, not the "...:" that opens a list
        if cut >= SHORT_SENTENCE or end > SUMMARY_CHARS:
            break
        cut = end
    line = paragraph[:cut].strip()
    if len(line) > SUMMARY_CHARS:
        line = line[:SUMMARY_CHARS].rsplit(" ", 1)[0] + " …"
    return line


def _first_prose_paragraph(nb) -> str:
    lines: list[str] = []
    for line in _markdown_lines(nb):
        prose = line.strip() and not HEADING.match(line) and not NOT_PROSE.match(line)
        if prose:
            lines.append(line.strip())
        elif lines:
            break
    return _plain(" ".join(lines))


def _plain(markdown: str) -> str:
    """Inline markdown without links' targets and emphasis marks; code spans stay."""
    text = LINK.sub(r"\1", markdown)
    text = re.sub(r"(\*\*|__)(\S.*?)\1", r"\2", text)
    text = re.sub(r"(?<![\w*])\*(\S[^*]*?)\*(?![\w*])", r"\1", text)
    return re.sub(r"\s+", " ", text).strip()


def key_figure(nb) -> Figure | None:
    """The last PNG of a cell tagged KEY_FIGURE_TAG, else the last PNG of the notebook."""
    found: list[Figure] = []
    tagged: list[Figure] = []
    section = ""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            section = _last_heading(_source(cell)) or section
            continue
        for png in _pngs(cell):
            figure = Figure(png, section)
            found.append(figure)
            if KEY_FIGURE_TAG in cell.get("metadata", {}).get("tags", []):
                tagged.append(figure)
    chosen = tagged or found
    return chosen[-1] if chosen else None


def _last_heading(markdown: str) -> str:
    headings = [HEADING.match(line) for line in markdown.splitlines()]
    texts = [_plain(m.group(2)) for m in headings if m]
    return texts[-1] if texts else ""


def _pngs(cell) -> list[bytes]:
    data = [out.get("data", {}) for out in cell.get("outputs", [])]
    return [base64.b64decode(d["image/png"]) for d in data if "image/png" in d]


def exercise_names(nb, registered: list[str]) -> list[str]:
    """The registry's exercises of this notebook, then any other that a cell's metadata
    names (``"exercise": "02.shift"``, the key tools/solved.py reads)."""
    named = [name for _, name in exercise_cells(nb) if name]
    return list(dict.fromkeys([*registered, *named]))


def exercise_status(nb, name: str, not_solved: str) -> str:
    """What this run's outputs say of exercise ``name``: ex.check prints "NAME: passed."
    or "NAME: not solved yet. <hint>", or raises ExerciseFailed in the cell that names it;
    none of these means its check did not run."""
    printed = "\n".join(_stream_text(out) for cell in nb.cells
                        for out in cell.get("outputs", []))
    if f"{name}: passed" in printed:
        return "passed"
    if f"{name}: {not_solved}" in printed:
        return not_solved
    if any(_failed_check(cell, name) for cell in nb.cells):
        return "failed"
    return "not checked in this run"


def _failed_check(cell, name: str) -> bool:
    names_it = f'"{name}"' in _source(cell) or f"'{name}'" in _source(cell)
    return names_it and any(out.get("ename") == "ExerciseFailed"
                            for out in cell.get("outputs", []))


def _stream_text(output) -> str:
    text = output.get("text", "") if output.get("output_type") == "stream" else ""
    return "".join(text) if isinstance(text, list) else text
