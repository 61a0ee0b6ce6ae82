"""``ddp-lab notebooks --pattern`` after a full run: the front page keeps the other entries."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ddp_lab.tools.notebook_report import NotebookReport
from ddp_lab.tools.notebook_runner import write_index

ENTRY = re.compile(r'<li class="notebook (\w+)" id="([^"]+)">(.*?)</li>\n?(?=<li class="notebook|'
                   r"</ol>)", re.S)


def _report(name: str, ok: bool, seconds: float) -> NotebookReport:
    return NotebookReport(path=Path("notebooks") / name, seconds=seconds, ok=ok,
                          error_name="" if ok else "ValueError",
                          error_message="" if ok else "boom")


def _entries(page: str) -> list[tuple[str, str, str]]:
    """(status class, notebook file name, the entry's HTML) in page order."""
    return ENTRY.findall(page)


def test_a_partial_run_updates_its_entries_and_keeps_the_others(tmp_path: Path):
    write_index([_report("00_a.ipynb", True, 1.0), _report("01_b.ipynb", True, 2.0),
                 _report("02_c.ipynb", True, 3.0)], tmp_path)
    page = write_index([_report("01_b.ipynb", False, 4.0)], tmp_path).read_text()

    assert "2/3 passed" in page
    entries = _entries(page)
    assert [name for _, name, _ in entries] == [
        "00_a.ipynb", "01_b.ipynb", "02_c.ipynb"]  # notebook order, not run order
    status, _, failed = entries[1]
    assert status == "failed" and ">FAILED<" in failed and "4.0 s" in failed
    assert "boom" in failed
    assert entries[0][0] == "ok" and ">ok<" in entries[0][2] and "1.0 s" in entries[0][2]


def test_reading_order_is_the_course_plan(tmp_path: Path):
    """00, 00b, 01, ..., 09b, 10: the file names sort as the course reads, whatever the
    order of the runs."""
    names = ["10_j.ipynb", "01_b.ipynb", "00b_a.ipynb", "09b_i.ipynb", "00_a.ipynb",
             "09_h.ipynb"]
    for name in names:
        write_index([_report(name, True, 1.0)], tmp_path)
    page = (tmp_path / "index.html").read_text()
    assert [name for _, name, _ in _entries(page)] == [
        "00_a.ipynb", "00b_a.ipynb", "01_b.ipynb", "09_h.ipynb", "09b_i.ipynb", "10_j.ipynb"]


def test_a_report_without_its_store_starts_afresh(tmp_path: Path):
    (tmp_path / "index.json").write_text("not json")
    page = write_index([_report("00_a.ipynb", True, 1.0)], tmp_path).read_text()
    assert "1/1 passed" in page


def test_a_store_from_the_table_of_before_starts_afresh(tmp_path: Path):
    """index.json as the one-row-per-notebook table left it: rows of HTML, no format."""
    old = {"09_z.ipynb": {"ok": True, "row": "<tr class=\"ok\"><td>09_z.ipynb</td></tr>"}}
    (tmp_path / "index.json").write_text(json.dumps(old))
    page = write_index([_report("00_a.ipynb", True, 1.0)], tmp_path).read_text()
    assert "1/1 passed" in page and "09_z" not in page
