"""``ddp-lab notebooks --pattern`` after a full run: the report keeps the other rows."""

from __future__ import annotations

from pathlib import Path

from ddp_lab.tools.notebook_report import NotebookReport
from ddp_lab.tools.notebook_runner import write_index


def _report(name: str, ok: bool, seconds: float) -> NotebookReport:
    return NotebookReport(path=Path("notebooks") / name, seconds=seconds, ok=ok,
                          error_name="" if ok else "ValueError",
                          error_message="" if ok else "boom")


def test_a_partial_run_updates_its_rows_and_keeps_the_others(tmp_path: Path):
    write_index([_report("00_a.ipynb", True, 1.0), _report("01_b.ipynb", True, 2.0),
                 _report("02_c.ipynb", True, 3.0)], tmp_path)
    page = write_index([_report("01_b.ipynb", False, 4.0)], tmp_path).read_text()

    assert "2/3 passed" in page
    rows = [line for line in page.splitlines() if line.startswith("<tr class=")]
    assert [r.split("<td>")[1].split("<")[0] for r in rows] == [
        "00_a.ipynb", "01_b.ipynb", "02_c.ipynb"]  # notebook order, not run order
    assert "FAILED" in rows[1] and "4.0" in rows[1] and "boom" in rows[1]
    assert "ok" in rows[0] and "1.0" in rows[0]


def test_a_report_without_its_store_starts_afresh(tmp_path: Path):
    (tmp_path / "index.json").write_text("not json")
    page = write_index([_report("00_a.ipynb", True, 1.0)], tmp_path).read_text()
    assert "1/1 passed" in page
