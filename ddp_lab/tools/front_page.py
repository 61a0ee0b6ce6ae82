"""The course's front page, ``build/index.html``: the notebooks in reading order, each with
its title, what it teaches, a thumbnail of its key figure from this run, its exercises,
its time and status, and links to its rendered page and notebooks.

What a notebook says is read by tools/notebook_card.py, what the learner's checks said by
tools/exercise_status.py; the HTML is tools/front_page_html.py. This module turns a run's
reports into entries (writing the thumbnails), and merges them with the entries of earlier
runs kept in ``build/index.json``, so that ``ddp-lab notebooks --pattern "03_*"`` after a
full run updates one entry instead of replacing the page; the learner's checks go to
their progress over runs (tools/progress.py), which the page shows too.
"""

from __future__ import annotations

import io
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import quote

import nbformat

from ddp_lab.tools import notebook_card as card
from ddp_lab.tools import progress as course_progress
from ddp_lab.tools.exercise_status import NOT_CHECKED, SOLVED, CheckResult, learner_check
from ddp_lab.tools.front_page_html import render
from ddp_lab.tools.notebook_report import NotebookReport

STORE_FORMAT = 3  # index.json of another format (an older ddp-lab's) starts afresh
REFERENCE_PASSED = "reference passed (--solved)"  # solved mode: not the learner's work
THUMBNAIL_BOX = (480, 320)  # pixels: the page shows 240 wide, sharp on a 2x screen


@dataclass(frozen=True)
class ExerciseLine:
    name: str
    summary: str
    status: str  # exercise_status's: "solved", "not solved yet", "failed", "not checked ..."
    feedback: str = ""  # the first line of what the learner's check said


@dataclass(frozen=True)
class Entry:
    """One notebook on the front page. Paths are links relative to the build folder, so
    that the page works opened from disk; ``thumbnail`` is "" for a notebook that drew
    no figure."""

    name: str
    title: str
    summary: str
    ok: bool
    seconds: float
    error: str
    ran_at: str
    thumbnail: str
    thumbnail_size: tuple[int, int]
    figure_alt: str
    exercises: tuple[ExerciseLine, ...]
    links: tuple[tuple[str, str], ...]  # (label, href)

    @classmethod
    def from_json(cls, data: dict) -> Entry:
        return cls(**{**data, "thumbnail_size": tuple(data["thumbnail_size"]),
                      "exercises": tuple(ExerciseLine(**e) for e in data["exercises"]),
                      "links": tuple(tuple(link) for link in data["links"])})


def write_index(reports: list[NotebookReport], build_dir: Path | str,
                solved: bool = False) -> Path:
    """Write ``build_dir/index.html`` (the front page) for this run's ``reports``, keeping
    the entries of notebooks this run did not execute as the last run left them, and
    record the learner's checks in their progress (not in ``solved`` mode, where the
    exercise cells held the references)."""
    build_dir = Path(build_dir).resolve()
    registered = _registered_exercises()
    new = {r.name: entry_of(r, build_dir, registered, solved) for r in reports}
    if solved:
        progress = course_progress.load(build_dir)
    else:
        progress = course_progress.record(build_dir, _checks(reports, new))
    entries = _merged(build_dir / "index.json", new)
    index = build_dir / "index.html"
    course = [name for names in registered.values() for name in names]
    index.write_text(render(list(entries.values()), progress, course), encoding="utf-8")
    return index


def _checks(reports: list[NotebookReport], entries: dict[str, Entry]):
    """This run's learner checks, as tools/progress.py records them."""
    return [(line.name, report.name, CheckResult(line.status, line.feedback),
             report.started_at or time.time())
            for report in reports for line in entries[report.name].exercises]


def entry_of(report: NotebookReport, build_dir: Path, registered: dict,
             solved: bool = False) -> Entry:
    """The front page's entry for one report; writes (or removes) its thumbnail."""
    nb = _notebook_of(report)
    stem = report.path.stem
    figure = card.key_figure(nb) if nb is not None else None
    thumbnail, size = _write_thumbnail(figure, build_dir / "html" / f"{stem}.thumb.png")
    title = card.title(nb, stem) if nb is not None else stem
    return Entry(
        name=report.name, title=title, summary=card.summary(nb) if nb is not None else "",
        ok=report.ok, seconds=report.seconds, error="" if report.ok else report.describe(),
        ran_at=course_progress.local_time(report.started_at) if report.started_at else "",
        thumbnail=_href(thumbnail, build_dir) if thumbnail else "", thumbnail_size=size,
        figure_alt=_alt_text(figure, title),
        exercises=_exercises(nb, registered.get(stem, []), solved),
        links=_links(report, build_dir),
    )


def _notebook_of(report: NotebookReport):
    """The executed copy (with this run's outputs), else the source, else None."""
    for path in (report.executed_path, report.path):
        if path is not None and Path(path).is_file():
            return nbformat.read(path, as_version=4)
    return None


def _write_thumbnail(figure, path: Path) -> tuple[Path | None, tuple[int, int]]:
    """A PNG scaled down to fit THUMBNAIL_BOX; an old one goes when there is no figure.

    Pillow is there wherever matplotlib is (a dependency of it since matplotlib 3.3)."""
    from PIL import Image

    if figure is None:
        path.unlink(missing_ok=True)
        return None, (0, 0)
    image = Image.open(io.BytesIO(figure.png))
    image.thumbnail(THUMBNAIL_BOX)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="PNG", optimize=True)
    return path, image.size


def _alt_text(figure, title: str) -> str:
    if figure is None:
        return ""
    where = f", section “{figure.section}”" if figure.section else ""
    return f"Key figure of “{title}”{where}, as drawn by this run"


def _registered_exercises() -> dict[str, list[str]]:
    """Exercise names by notebook stem, from the registry's ``notebook`` field."""
    import ddp_lab.exercises as ex

    by_notebook: dict[str, list[str]] = {}
    for name in ex.names():
        notebook = Path(ex.find(name).notebook).stem
        by_notebook.setdefault(notebook, []).append(name)
    return by_notebook


def _exercises(nb, registered: list[str], solved: bool) -> tuple[ExerciseLine, ...]:
    names = card.exercise_names(nb, registered) if nb is not None else registered
    lines = []
    for name in names:
        result = learner_check(nb, name) if nb is not None else CheckResult(NOT_CHECKED, "")
        status = REFERENCE_PASSED if solved and result.status == SOLVED else result.status
        lines.append(ExerciseLine(name, _describe(name), status, result.feedback))
    return tuple(lines)


def _describe(name: str) -> str:
    """The registry's one line on the exercise; "" for a name it does not know (a cell's
    metadata may name one that was renamed since)."""
    import ddp_lab.exercises as ex

    try:
        return ex.describe(name)
    except ValueError:
        return ""


def _links(report: NotebookReport, build_dir: Path) -> tuple[tuple[str, str], ...]:
    """The rendered page, the executed notebook and the source notebook, where they exist."""
    candidates = (("page", report.html_path), ("executed notebook", report.executed_path),
                  ("source", report.path))
    return tuple((label, _href(Path(path), build_dir)) for label, path in candidates
                 if path is not None and Path(path).is_file())


def _href(path: Path, build_dir: Path) -> str:
    """A link relative to the build folder, percent-encoded (works from file://)."""
    return quote(Path(os.path.relpath(path.resolve(), build_dir)).as_posix())


def _merged(store: Path, new: dict[str, Entry]) -> dict[str, Entry]:
    """Earlier entries updated with this run's, in reading order (file names sort as the
    course plan: 00, 00b, 01, ...); written back to ``store``."""
    entries = {**_load(store), **new}
    entries = dict(sorted(entries.items()))
    store.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": STORE_FORMAT,
               "notebooks": {name: asdict(entry) for name, entry in entries.items()}}
    store.write_text(json.dumps(payload, indent=1), encoding="utf-8")
    return entries


def _load(store: Path) -> dict[str, Entry]:
    try:
        data = json.loads(store.read_text(encoding="utf-8"))
        if data.get("format") != STORE_FORMAT:
            return {}  # a report from an older ddp-lab: this run starts a new one
        return {name: Entry.from_json(e) for name, e in data["notebooks"].items()}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return {}  # first run, or a store that is not ours
