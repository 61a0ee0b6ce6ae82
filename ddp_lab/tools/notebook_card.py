"""What the course's front page says about one notebook, read from the notebook itself:
its title, one line on what it teaches, its key figure and its exercises.

Why read it from the notebook and not keep a table of titles and summaries: the notebooks
change every day, and a second copy of what they say would drift. The first heading is the
title, the intro's own list of topics (or its first sentence that is not a bridge from the
notebook before) is the summary line, and the figure is the one the run just drew. What
each exercise's check said is tools/exercise_status.py. Pure functions on a notebook node:
no kernel, no files written.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass

from ddp_lab.tools.solved import cell_source, exercise_cells

# A code cell tagged so holds the notebook's key figure; untagged, the last figure drawn is.
KEY_FIGURE_TAG = "key-figure"
SUMMARY_CHARS = 240
SHORT_SENTENCE = 80  # characters: shorter, and the next sentence joins it
TOPIC_CHARS = 70  # a list item longer than this is cut at its first comma

HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.+?)\s*#*\s*$")
NOT_PROSE = re.compile(r"^\s*([-*+]\s|>|\||\d+[.)]\s|```|~~~|<|!\[|\$\$)")
NUMBERED = re.compile(r"^\s{0,3}\d+[.)]\s+")
# A sentence that opens with another notebook, or "so far", bridges from before.
BRIDGE = re.compile(r"^(In |As |After |Like )?(the )?(notebooks?|everything|every notebook) "
                    r"(\S*\d\S*|so far)|^.{0,40}\bso far\b", re.I)
THIS_NOTEBOOK = re.compile(r"^(In )?this notebook\b(?!:)", re.I)
LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
# A sentence ends at . ! ? before a space (or the end), unless the dot ends an abbreviation.
SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\bvs)(?<!\bal)(?<!\bcf)[.!?](?=\s|$)")


@dataclass(frozen=True)
class Figure:
    """A PNG the run drew, and the heading of the section it was drawn in (for alt text)."""

    png: bytes
    section: str


def _markdown_lines(nb):
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            yield from cell_source(cell).splitlines()
            yield ""  # a cell ends a paragraph


def title(nb, fallback: str) -> str:
    """The first markdown heading's text, or ``fallback`` for a notebook without one."""
    for line in _markdown_lines(nb):
        match = HEADING.match(line)
        if match:
            return _plain(match.group(2))
    return fallback


def summary(nb) -> str:
    """One line on what the notebook teaches, as inline markdown (code spans kept).

    In order: a summary written for the card (``metadata.ddp_lab.summary``); the intro's
    own numbered list ("In this notebook: 1. ... 2. ..."), each item to its first clause;
    else the intro's first sentence that is not a bridge from another notebook ("Notebook
    03 went through every collective." says what came before, not what comes now)."""
    written = nb.get("metadata", {}).get("ddp_lab", {}).get("summary", "")
    return _plain(written) if written else (_topics_line(nb) or _lead_sentence(nb))


def _lead_sentence(nb) -> str:
    """The intro's sentence that says what this notebook does ("This notebook measures
    ..."), else its first sentence that is no bridge, with the next one too while the
    line stays short; a closing ":" (that opened a list or a code block) becomes "."."""
    paragraphs = [_sentences(p) for p in _prose_paragraphs(_intro_lines(nb))]
    for wanted in (lambda s: THIS_NOTEBOOK.match(s), lambda s: not BRIDGE.match(s)):
        for sentences in paragraphs:
            kept = [i for i, s in enumerate(sentences) if wanted(s)]
            if kept:
                line = _short_line(sentences[kept[0]:])
                return line[:-1] + "." if line.endswith(":") else line
    return ""


def _short_line(sentences: list[str]) -> str:
    line = sentences[0]
    for sentence in sentences[1:]:  # whole sentences only, not the "...:" opening a list
        if len(line) >= SHORT_SENTENCE or len(line) + 1 + len(sentence) > SUMMARY_CHARS \
                or not SENTENCE_END.search(sentence[-1:]):
            break
        line = f"{line} {sentence}"
    if len(line) > SUMMARY_CHARS:
        line = line[:SUMMARY_CHARS].rsplit(" ", 1)[0] + " …"
    return line


def _sentences(paragraph: str) -> list[str]:
    starts = [0, *(m.end() for m in SENTENCE_END.finditer(paragraph))]
    pieces = [paragraph[a:b].strip() for a, b in zip(starts, [*starts[1:], len(paragraph)])]
    return [p for p in pieces if p]


def _intro_lines(nb):
    """The markdown before the notebook's first section heading (## and deeper)."""
    for line in _markdown_lines(nb):
        heading = HEADING.match(line)
        if heading and len(heading.group(1)) > 1:
            return
        yield line


def _prose_paragraphs(lines):
    paragraph: list[str] = []
    for line in lines:
        if line.strip() and not HEADING.match(line) and not NOT_PROSE.match(line):
            paragraph.append(line.strip())
        elif paragraph:
            yield _plain(" ".join(paragraph))
            paragraph = []
    if paragraph:
        yield _plain(" ".join(paragraph))


def _topics_line(nb) -> str:
    """The intro's first numbered list (two items or more) as one line of topics."""
    items = _numbered_items(_intro_lines(nb))
    if len(items) < 2:
        return ""
    line = ""
    for topic in (_first_clause(item) for item in items):
        joined = f"{line} · {topic}" if line else topic
        if len(joined) > SUMMARY_CHARS:
            line = f"{line} · …"
            break
        line = joined
    return line[:1].upper() + line[1:]


def _numbered_items(lines) -> list[str]:
    items: list[str] = []
    for line in lines:
        start = NUMBERED.match(line)
        if start:
            items.append(line[start.end():].strip())
        elif items and line.startswith((" ", "\t")) and line.strip():
            items[-1] += " " + line.strip()
        elif items:
            break  # the list ended
    return [_plain(item) for item in items]


def _first_clause(item: str) -> str:
    """An item up to the end of its first sentence or its first ":", ";" or " (" outside
    code spans, then up to a comma if still long; without the closing punctuation but a
    question's mark."""
    cut = _cut_at(item, (": ", "; ", " (", " — ", ". ", "? "))
    if len(cut) > TOPIC_CHARS:
        shorter = _cut_at(cut, (", ",))
        cut = shorter if len(shorter) >= 4 else cut
    return cut.rstrip(" ;.,:")


def _cut_at(text: str, marks: tuple[str, ...]) -> str:
    spots = [i + (mark == "? ") for mark in marks for i in _find_all(text, mark)
             if text[:i].count("`") % 2 == 0]
    return text[:min(spots)] if spots else text


def _find_all(text: str, mark: str):
    start = text.find(mark)
    while start != -1:
        yield start
        start = text.find(mark, start + 1)


def _plain(markdown: str) -> str:
    """Inline markdown without links' targets and emphasis marks; code spans stay as
    they are (``if __name__ == "__main__":`` keeps its underscores)."""
    spans = re.findall(r"`[^`]*`", markdown)
    text = re.sub(r"`[^`]*`", "\0", markdown)  # emphasis is read around the spans only
    text = LINK.sub(r"\1", text)
    text = re.sub(r"(\*\*|__)(\S.*?)\1", r"\2", text)
    text = re.sub(r"(?<![\w*])\*(\S[^*]*?)\*(?![\w*])", r"\1", text)
    text = re.sub("\0", lambda _: spans.pop(0), text)
    return re.sub(r"\s+", " ", text).strip()


def key_figure(nb) -> Figure | None:
    """The last PNG of a cell tagged KEY_FIGURE_TAG, else the last PNG of the notebook."""
    found: list[Figure] = []
    tagged: list[Figure] = []
    section = ""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            section = _last_heading(cell_source(cell)) or section
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
