"""The course's front page (build/index.html): what it reads from each notebook, the entry it
writes, and, in headless Chromium, the page a learner opens from disk after `make course`.

The plain tests build executed notebooks by hand (outputs as a kernel leaves them); the
browser test runs the real runner on a tiny course of two notebooks, one drawing a figure,
one failing.
"""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path
from urllib.parse import unquote, urlparse

import nbformat
import pytest
from matplotlib.figure import Figure

import browser_helpers as lab_ui
from ddp_lab.tools import notebook_card as card
from ddp_lab.tools.exercise_status import (FAILED, NOT_CHECKED, NOT_SOLVED, SOLVED,
                                           CheckResult, learner_check, learner_check_cell)
from ddp_lab.tools.front_page import THUMBNAIL_BOX, write_index
from ddp_lab.tools.front_page_html import inline_markdown
from ddp_lab.tools.notebook_report import NotebookReport
from ddp_lab.tools.notebook_runner import run_all

md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
SCREENSHOT = lab_ui.ROOT / "build" / "test-artifacts" / "front_page.png"


def _png(width_in: float = 6.4, height_in: float = 4.8) -> bytes:
    fig = Figure(figsize=(width_in, height_in), dpi=100)
    fig.subplots().plot([1, 4, 9])
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _figure_output(png: bytes):
    return nbformat.v4.new_output("display_data", data={
        "image/png": base64.b64encode(png).decode(), "text/plain": "<Figure size 640x480>"})


def _printed(text: str):
    return nbformat.v4.new_output("stream", name="stdout", text=text)


def _with_outputs(cell, *outputs):
    cell.outputs = list(outputs)
    return cell


def _executed(tmp_path: Path, name: str, cells) -> NotebookReport:
    """A report as the runner leaves it: executed copy and page under tmp_path/build."""
    build = tmp_path / "build"
    executed, page = build / "notebooks" / name, build / "html" / f"{Path(name).stem}.html"
    for path in (executed, page):
        path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nbformat.v4.new_notebook(cells=cells), executed)
    page.write_text("<html>rendered</html>")
    return NotebookReport(path=tmp_path / "notebooks" / name, seconds=3.25, ok=True,
                          executed_path=executed, html_path=page)


INTRO = md("# 02 · Point to point: one rank sends\n\n"
           "A collective involves every rank; see [the tutorial](https://example.org/t).\n"
           "**Point-to-point** calls like `dist.send` are simpler. Pipelines use them.\n\n"
           "1. a list item that is not the summary.")


# ---- what is read from a notebook -------------------------------------------------------

def test_title_is_the_first_heading_and_the_summary_its_first_sentence():
    nb = nbformat.v4.new_notebook(cells=[code("x = 1"), INTRO, md("## 1. Later")])
    assert card.title(nb, "fallback") == "02 · Point to point: one rank sends"
    # The first sentence is short, so the second joins it; the third does not.
    assert card.summary(nb) == ("A collective involves every rank; see the tutorial. "
                                "Point-to-point calls like `dist.send` are simpler.")


def test_summary_skips_lists_and_headings_and_keeps_abbreviations():
    first = ("Ranks talk over a network, e.g. over gloo's TCP pairs, as Li et al. describe "
             "in their paper on DDP.")
    nb = nbformat.v4.new_notebook(cells=[
        md("# T\n\n- a list\n- more"), md(f"{first}\n**Bold** starts no list. `x` too.")])
    assert len(first) > card.SHORT_SENTENCE and card.summary(nb) == first
    short = nbformat.v4.new_notebook(cells=[md("Short one. This notebook:\n\n1. does x")])
    assert card.summary(short) == "Short one."  # not the colon that opens the list
    wrapped = nbformat.v4.new_notebook(cells=[md("A line that goes on\n**and on** here.")])
    assert card.summary(wrapped) == "A line that goes on and on here."
    assert card.title(nbformat.v4.new_notebook(cells=[md("no heading")]), "x_y") == "x_y"
    assert card.summary(nbformat.v4.new_notebook(cells=[code("1")])) == ""


def test_key_figure_is_the_last_one_unless_a_cell_is_tagged():
    first, last = _png(2, 2), _png(3, 1)
    cells = [md("## 1. First"), _with_outputs(code("a"), _figure_output(first)),
             md("## 2. Second"), _with_outputs(code("b"), _figure_output(last))]
    figure = card.key_figure(nbformat.v4.new_notebook(cells=cells))
    assert (figure.png, figure.section) == (last, "2. Second")

    cells[1].metadata["tags"] = [card.KEY_FIGURE_TAG]
    figure = card.key_figure(nbformat.v4.new_notebook(cells=cells))
    assert (figure.png, figure.section) == (first, "1. First")
    assert card.key_figure(nbformat.v4.new_notebook(cells=[INTRO])) is None


def test_the_summary_is_the_intros_own_list_of_topics_one_clause_each():
    intro = md("# 01 · Processes\n\nIn notebook 00, ranks were ready. This notebook opens "
               "that box:\n\n1. what a **process group** is: rank, world size;\n"
               "2. how ranks find each other (three init methods), each really run\n"
               "   on several ranks;\n3. `barrier()`, seen on a timeline drawn from every "
               "rank's own clock and more words;\n4. where does the time go? A trace.\n\n"
               "## 1. A section\n\n1. a later list is not the intro's")
    nb = nbformat.v4.new_notebook(cells=[intro])
    assert card.summary(nb) == ("What a process group is · how ranks find each other · "
                                "`barrier()` · where does the time go?")


def test_the_summary_skips_a_bridge_and_prefers_what_this_notebook_does():
    bridge = nbformat.v4.new_notebook(cells=[md(
        "# 03b · Practice\n\nNotebook 03 went through every collective, before and after. "
        "Collectives are used well here, each point measured on real ranks.")])
    assert card.summary(bridge) == ("Collectives are used well here, each point measured "
                                    "on real ranks.")
    this = nbformat.v4.new_notebook(cells=[md(
        "# 10 · Sharding\n\nDDP (notebooks 05-07) copies everything.\n\n| a | b |\n\n"
        "This notebook measures where the memory goes, then builds ZeRO:")])
    assert card.summary(this) == "This notebook measures where the memory goes, then builds ZeRO."
    so_far = nbformat.v4.new_notebook(cells=[md(
        "Every notebook so far used `ddp_lab`. Here `torchrun` starts the ranks.")])
    assert card.summary(so_far) == "Here `torchrun` starts the ranks."


def test_a_summary_written_for_the_card_wins_and_code_spans_keep_their_underscores():
    nb = nbformat.v4.new_notebook(cells=[INTRO], metadata={
        "ddp_lab": {"summary": "How **ranks** guard `if __name__ == \"__main__\":`."}})
    assert card.summary(nb) == 'How ranks guard `if __name__ == "__main__":`.'


def _stub(name="00.max_over_ranks", fn="max_over_ranks"):
    return code(f"def {fn}(value):\n    raise NotImplementedError",
                metadata={"tags": ["exercise"], "exercise": name})


def _error(ename: str, evalue: str):
    return nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[])


def test_the_status_is_the_learners_own_check_never_a_reference_check_after_it():
    """The learner's check said "not solved yet", then a cell checked other code that
    passed (as a notebook may, to teach); 01 checks a wrong function on purpose."""
    nb = nbformat.v4.new_notebook(cells=[
        _with_outputs(code('ex.check("07b.your_own_ddp", scratch.DDP)'),
                      _printed("07b.your_own_ddp: passed. before the stub\n")),
        _stub("07b.your_own_ddp", "MyDDP"),
        _with_outputs(code('ex.check("07b.your_own_ddp", MyDDP);'),
                      _printed("07b.your_own_ddp: not solved yet. Start with the broadcast.\n"
                               "more hint\n")),
        _with_outputs(code('report = ex.check("07b.your_own_ddp", scratch.DDP)'),
                      _printed("07b.your_own_ddp: passed. 3 world sizes\n")),
        _with_outputs(code('ex.check("07b.your_own_ddp", leaky)'),
                      _error("ExerciseFailed", "leaky is wrong"))])
    assert learner_check(nb, "07b.your_own_ddp") == CheckResult(
        NOT_SOLVED, "Start with the broadcast.")
    assert learner_check_cell(nb, "07b.your_own_ddp") == 2


def test_solved_failed_and_not_checked_with_the_first_line_of_the_feedback():
    def status(*outputs, check='ex.check("00.max_over_ranks", max_over_ranks)'):
        nb = nbformat.v4.new_notebook(cells=[_stub(), _with_outputs(code(check), *outputs)])
        return learner_check(nb, "00.max_over_ranks")

    assert status(_printed("00.max_over_ranks: passed. on 1-4 ranks\n")) == CheckResult(
        SOLVED, "on 1-4 ranks")
    assert status(_error("ExerciseFailed", "rank 1 returned 3, expected 4\n\ntensors")) == \
        CheckResult(FAILED, "rank 1 returned 3, expected 4")
    assert status(_error("WorkerError", "rank 2 failed\nTraceback")) == CheckResult(
        FAILED, "WorkerError: rank 2 failed")
    assert status() == CheckResult(NOT_CHECKED, "")  # the run stopped before the check
    # Solved mode binds the reference to the stub's name; the check passes that name.
    solved_cell = code("def reference(value):\n    ...\nmax_over_ranks = reference",
                       metadata={"tags": ["exercise"], "exercise": "00.max_over_ranks"})
    nb = nbformat.v4.new_notebook(cells=[solved_cell, code('ex.check("00.max_over_ranks", '
                                                           'reference)'),
                                         code('ex.check("00.max_over_ranks", max_over_ranks)')])
    assert learner_check_cell(nb, "00.max_over_ranks") == 1  # both names are the stub's
    no_check = nbformat.v4.new_notebook(cells=[_stub()])
    assert learner_check(no_check, "00.max_over_ranks").status == NOT_CHECKED


def test_inline_markdown_escapes_and_keeps_code_spans():
    assert inline_markdown("a <b> `x < y` & c") == "a &lt;b&gt; <code>x &lt; y</code> &amp; c"


# ---- the entry written -----------------------------------------------------------------

def _entry_html(page: str, name: str) -> str:
    match = re.search(rf'<li class="notebook \w+" id="{re.escape(name)}">(.*?)</li>\n', page,
                      re.S)
    assert match, f"no entry for {name}"
    return match.group(1)


def test_an_entry_holds_title_summary_thumbnail_exercises_time_and_links(tmp_path: Path):
    stub = code("def max_over_ranks(value):\n    raise NotImplementedError",
                metadata={"tags": ["exercise"], "exercise": "00.max_over_ranks"})
    check = _with_outputs(code('ex.check("00.max_over_ranks", max_over_ranks);'),
                          _printed("00.max_over_ranks: not solved yet. Reduce with MAX.\n"))
    cells = [INTRO, _with_outputs(code("plot"), _figure_output(_png())), stub, check]
    report = _executed(tmp_path, "02_point.ipynb", cells)
    (tmp_path / "notebooks").mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=cells), report.path)  # the source

    build = tmp_path / "build"
    page = write_index([report], build).read_text()
    entry = _entry_html(page, "02_point.ipynb")

    # Self-contained: inline CSS, no script, no stylesheet or image from elsewhere.
    assert "<style>" in page and not re.search(r"<script|<link|https?://", page)

    assert '<h2 class="title"><a href="html/02_point.html">02 · Point to point' in entry
    assert ("A collective involves every rank; see the tutorial. Point-to-point calls like "
            "<code>dist.send</code> are simpler.</p>") in entry
    assert '<span class="status">ok</span>' in entry and "3.2 s" in entry
    thumbnail = build / "html" / "02_point.thumb.png"
    assert 'src="html/02_point.thumb.png" alt="Key figure of “02 · Point' in entry
    assert thumbnail.read_bytes().startswith(b"\x89PNG")
    from PIL import Image
    with Image.open(thumbnail) as image:
        assert image.width <= THUMBNAIL_BOX[0] and image.height <= THUMBNAIL_BOX[1]
        assert image.width < 640  # scaled down from the figure's 640 x 480
    assert re.search(r"<code>00.max_over_ranks</code> <span class=\"ex-status "
                     r"not-solved-yet\">not solved yet</span> max_over_ranks\(value\)", entry)
    hrefs = re.findall(r'<a class="link" href="([^"]+)">', entry)
    assert hrefs == ["html/02_point.html", "notebooks/02_point.ipynb",
                     "../notebooks/02_point.ipynb"]
    assert all((build / unquote(h)).is_file() for h in hrefs)


def test_a_notebook_without_a_figure_says_so_and_loses_its_old_thumbnail(tmp_path: Path):
    with_figure = [INTRO, _with_outputs(code("plot"), _figure_output(_png()))]
    write_index([_executed(tmp_path, "05_x.ipynb", with_figure)], tmp_path / "build")
    thumbnail = tmp_path / "build" / "html" / "05_x.thumb.png"
    assert thumbnail.exists()

    page = write_index([_executed(tmp_path, "05_x.ipynb", [INTRO])], tmp_path / "build")
    entry = _entry_html(page.read_text(), "05_x.ipynb")
    assert "no figure in this run" in entry and "<img" not in entry
    assert not thumbnail.exists()


def test_a_failed_entry_shows_where_and_why_and_lists_the_registry_exercises(tmp_path: Path):
    """The registry's notebook field gives the exercises even when the run never reached
    their check; the page says so instead of guessing."""
    report = NotebookReport(path=tmp_path / "00_launching_from_jupyter.ipynb", seconds=7.0,
                            ok=False, failed_cell=2, error_name="ValueError",
                            error_message="boom <here>")
    entry = _entry_html(write_index([report], tmp_path / "build").read_text(),
                        "00_launching_from_jupyter.ipynb")
    assert '<span class="status">FAILED</span>' in entry and "code cell 2" in entry
    assert "ValueError: boom &lt;here&gt;" in entry
    assert "<code>00.max_over_ranks</code>" in entry and "not checked in this run" in entry
    assert "no figure in this run" in entry


# ---- in a real browser -----------------------------------------------------------------

TINY_COURSE = {
    "a_figure": [
        md("# A · Drawing a figure\n\nThis notebook draws one line with `matplotlib`.\n\n"
           "A paragraph that is not the summary."),
        code("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\n"
             "ax.plot([1, 4, 9])\nplt.show()"),
        code('def max_over_ranks(value):\n    """The largest value."""\n'
             "    raise NotImplementedError",
             metadata={"tags": ["exercise"], "exercise": "00.max_over_ranks"}),
        code('import ddp_lab.exercises as ex\nex.check("00.max_over_ranks", max_over_ranks);'),
    ],
    "b_fail": [
        md("# B · A failing notebook\n\nIts second code cell raises on purpose."),
        code("x = 1"),
        code("raise ValueError('boom in the second cell')"),
    ],
}


@pytest.fixture
def chromium():
    """A headless Chromium tab (Debian's, driven by Playwright), closed after the test."""
    missing = lab_ui.missing_requirements()
    if missing:
        if lab_ui.IN_CI:
            pytest.fail(f"CI=true but the browser test lacks {missing}: see .ci/run")
        pytest.skip(f"needs {' and '.join(missing)}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # --no-sandbox: Chromium refuses to start as root (CI) with its sandbox on; the
        # page is this test's own file.
        browser = playwright.chromium.launch(headless=True, executable_path=str(lab_ui.CHROMIUM),
                                             args=["--no-sandbox"])
        try:
            tab = browser.new_page(viewport={"width": 1200, "height": 900})
            tab.set_default_timeout(30_000)
            yield tab
        finally:
            browser.close()


def _texts(page, selector: str) -> list[str]:
    return [t.strip() for t in page.locator(selector).all_text_contents()]


@pytest.mark.browser
@pytest.mark.timeout(240)
def test_front_page_of_a_tiny_course_in_chromium(tmp_path: Path, chromium):
    course = tmp_path / "notebooks"
    course.mkdir()
    for name, cells in TINY_COURSE.items():
        nbformat.write(nbformat.v4.new_notebook(cells=cells), course / f"{name}.ipynb")
    build = tmp_path / "build"
    run_all(course, build, progress=lambda line: None, timeout_per_cell=120)

    page = chromium
    page.goto((build / "index.html").as_uri())
    page.wait_for_function("[...document.images].every(i => i.complete)")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)

    assert _texts(page, "h2.title") == ["A · Drawing a figure", "B · A failing notebook"]
    assert _texts(page, ".summary") == ["This notebook draws one line with matplotlib.",
                                        "Its second code cell raises on purpose."]
    assert _texts(page, ".status") == ["ok", "FAILED"]
    assert all(re.fullmatch(r"\d+\.\d s", s) for s in _texts(page, ".seconds"))
    assert "1/2 passed" in page.locator(".totals").inner_text()

    images = page.evaluate("[...document.images].map(i => [i.naturalWidth, i.alt])")
    assert len(images) == 1 and images[0][0] > 0 and "A · Drawing a figure" in images[0][1]
    failed = page.locator("li.notebook.failed")
    assert "no figure in this run" in failed.locator(".thumb").inner_text()
    assert "ValueError: boom in the second cell" in failed.locator(".error").inner_text()
    assert "code cell 2" in failed.locator(".error").inner_text()

    exercise = page.locator("li.notebook.ok li.exercise")
    assert exercise.locator("code").inner_text() == "00.max_over_ranks"
    assert exercise.locator(".ex-status").inner_text() == "not solved yet"
    assert exercise.locator(".feedback").inner_text().strip()  # the check's hint, first line
    assert re.fullmatch(r"Your exercises: 0 of \d+ solved",
                        page.locator(".progress").inner_text())
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", t) for t in _texts(page, ".ran-at"))
    assert "No exercises." in failed.inner_text()

    urls = page.evaluate("[...document.querySelectorAll('a[href]')].map(a => a.href)"
                         ".concat([...document.images].map(i => i.src))")
    assert all(u.startswith("file://") for u in urls)
    targets = {Path(unquote(urlparse(u).path)) for u in urls}
    assert all(t.is_file() for t in targets), [t for t in targets if not t.is_file()]
    assert {t.relative_to(tmp_path).as_posix() for t in targets} == {
        f"{folder}/{name}{suffix}" for name in TINY_COURSE
        for folder, suffix in (("build/html", ".html"), ("build/notebooks", ".ipynb"),
                               ("notebooks", ".ipynb"))} | {"build/html/a_figure.thumb.png"}

    page.locator("li.notebook.ok h2.title a").click()
    page.wait_for_load_state()
    assert page.url.endswith("/html/a_figure.html")
    assert "Drawing a figure" in page.locator("body").inner_text()
