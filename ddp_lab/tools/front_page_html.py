"""The front page's HTML: one self-contained file (inline CSS, no script, no external asset)
that reads the same opened from disk, served, or attached to a CI run.

The entries come from tools/front_page.py and the learner's progress over runs from
tools/progress.py; every text in them is escaped here, and the summary's inline code
spans (`like this`) become <code>.
"""

from __future__ import annotations

import html
import re

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1100px;margin:auto;
 padding:0 1.2em 3em;color:#1d1d1f;line-height:1.45}
header{border-bottom:1px solid #ddd;margin-bottom:1em}
.totals{color:#555}
ol.course{list-style:none;padding:0;margin:0}
li.notebook{display:grid;grid-template-columns:240px 1fr;gap:1.2em;padding:1em 0;
 border-bottom:1px solid #eee}
.thumb img{max-width:240px;height:auto;border:1px solid #ddd;border-radius:4px;background:#fff}
.thumb.none{width:240px;height:90px;display:flex;align-items:center;justify-content:center;
 color:#888;border:1px dashed #ccc;border-radius:4px;font-size:.9em}
h2.title{margin:0 0 .2em;font-size:1.2em}
h2.title a{color:inherit;text-decoration:none} h2.title a:hover{text-decoration:underline}
.summary{margin:.2em 0 .5em}
.meta{font-size:.9em;color:#555;margin:.2em 0}
.status{font-weight:600;padding:0 .45em;border-radius:3px}
li.ok .status{background:#e3f5e1;color:#1b6e1b} li.failed .status{background:#fde2e1;color:#a11}
.error{background:#fff4f4;border-left:3px solid #c33;padding:.3em .6em;font-size:.88em;
 white-space:pre-wrap;overflow-wrap:anywhere}
ul.exercises{margin:.3em 0;padding-left:1.2em;font-size:.92em}
.ex-status{font-size:.85em;padding:0 .4em;border-radius:3px;background:#eee}
.ex-status.passed{background:#e3f5e1} .ex-status.failed{background:#fde2e1}
.ex-status.not-solved-yet{background:#fff3cd} .ex-status.solved{background:#e3f5e1}
.feedback{display:block;color:#555;font-size:.92em;margin-left:.5em;overflow-wrap:anywhere}
.ex-earlier{font-size:.85em;color:#1b6e1b}
.progress{font-weight:600}
code{background:#f3f3f3;padding:0 .2em;border-radius:3px;font-size:.92em}
"""


def render(entries, progress=None, course: list[str] | None = None) -> str:
    """The whole page for ``entries`` (already in reading order), with the learner's
    ``progress`` (tools/progress.py, by exercise name) over the ``course``'s exercises."""
    progress = progress or {}
    passed = sum(e.ok for e in entries)
    seconds = sum(e.seconds for e in entries)
    items = "\n".join(_entry(e, progress) for e in entries)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<title>ddp-lab: the course</title><style>{CSS}</style></head>
<body><header><h1>ddp-lab: the course</h1>
<p class="totals">{passed}/{len(entries)} passed, {seconds:.0f} s of notebooks in all.
Each entry shows what its notebook's last run drew and printed.</p>
{_progress_line(progress, course or [])}</header>
<ol class="course">
{items}
</ol></body></html>
"""


def _progress_line(progress, course: list[str]) -> str:
    solved = sum(progress[name].ever_solved for name in course if name in progress)
    return (f'<p class="progress-totals"><span class="progress">Your exercises: {solved} of '
            f'{len(course)} solved</span>, kept over runs in <code>progress.json</code> '
            f'(<code>ddp-lab progress</code> prints it).</p>')


def _entry(e, progress) -> str:
    status = "ok" if e.ok else "FAILED"
    page = dict(e.links).get("page", "")
    title = inline_markdown(e.title)
    heading = f'<a href="{html.escape(page)}">{title}</a>' if page else title
    error = f'<p class="error">{html.escape(e.error)}</p>' if e.error else ""
    return f"""<li class="notebook {status.lower()}" id="{html.escape(e.name)}">
{_thumbnail(e, page)}
<div class="body"><h2 class="title">{heading}</h2>
<p class="summary">{inline_markdown(e.summary)}</p>
<p class="meta"><span class="status">{status}</span> in <span class="seconds">{e.seconds:.1f} s</span>
 · <span class="file">{html.escape(e.name)}</span>{_ran_at(e.ran_at)}
 · {_links(e.links)}</p>
{error}{_exercises(e.exercises, progress)}</div></li>"""


def _ran_at(ran_at: str) -> str:
    return f' · ran at <span class="ran-at">{html.escape(ran_at)}</span>' if ran_at else ""


def _thumbnail(e, page: str) -> str:
    if not e.thumbnail:
        return '<div class="thumb none">no figure in this run</div>'
    width, height = e.thumbnail_size
    image = (f'<img src="{html.escape(e.thumbnail)}" alt="{html.escape(e.figure_alt)}"'
             f' width="{width}" height="{height}" loading="lazy">')
    return f'<a class="thumb" href="{html.escape(page)}">{image}</a>' if page else (
        f'<div class="thumb">{image}</div>')


def _links(links) -> str:
    return " ".join(f'<a class="link" href="{html.escape(href)}">{html.escape(label)}</a>'
                    for label, href in links)


def _exercises(exercises, progress) -> str:
    if not exercises:
        return '<p class="meta exercises-none">No exercises.</p>'
    items = "\n".join(_exercise(x, progress.get(x.name)) for x in exercises)
    return f'<p class="meta">Exercises:</p>\n<ul class="exercises">\n{items}\n</ul>'


def _exercise(x, kept) -> str:
    """Its status in this run, when it was first solved (kept over runs), its summary, and
    what the check said unless it is solved now."""
    earlier = (f' <span class="ex-earlier">first solved on {html.escape(kept.first_solved_at)}'
               f'</span>' if kept is not None and kept.ever_solved else "")
    summary = f" {html.escape(x.summary)}" if x.summary else ""
    feedback = (f'<span class="feedback">{html.escape(x.feedback)}</span>'
                if x.feedback and x.status != "solved" else "")
    return (f'<li class="exercise"><code>{html.escape(x.name)}</code> '
            f'<span class="ex-status {_css_class(x.status)}">{html.escape(x.status)}</span>'
            f'{earlier}{summary}{feedback}</li>')


def _css_class(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def inline_markdown(text: str) -> str:
    """Escaped text whose `code spans` become <code>; nothing else is interpreted."""
    parts = re.split(r"`([^`]+)`", text)
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(p)
                   for i, p in enumerate(parts))
