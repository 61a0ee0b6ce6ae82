"""What the kernel keeps of a rank's output, without processes: the head and the tail of a
log, bounded, with the count of what was dropped (output/kept_log.py), and lines cut at
``MAX_LINE_BYTES`` however the pipe delivers them (output/reader.py)."""

from __future__ import annotations

import re

import pytest

from ddp_lab.launch.output.kept_log import LINE_COST, KeptLog

MARKER = re.compile(r"^\.\.\. \[ddp_lab: (\d+) lines \(([\d.]+) MB\) dropped here; the first "
                    r"([\d.]+) MB and the last ([\d.]+) MB of this rank's output are kept\] "
                    r"\.\.\.$")


def _numbered(n: int, width: int = 20) -> list[str]:
    return [f"{i:0{width}d}" for i in range(n)]


def test_a_log_under_the_limit_is_kept_whole():
    log = KeptLog(limit=10_000)
    log.extend(["first", "", "last"])
    assert log.text() == "first\n\nlast" and log.dropped_lines == 0


def test_a_long_log_keeps_its_head_and_tail_and_counts_the_rest():
    lines = _numbered(1000)  # 20 characters each: a line costs 20 + LINE_COST
    per_part = 50
    log = KeptLog(limit=per_part * (20 + LINE_COST))
    log.extend(lines[:400])
    log.extend(lines[400:])
    kept = log.text().split("\n")
    assert kept[:per_part] == lines[:per_part] and kept[-per_part:] == lines[-per_part:]
    dropped, dropped_mb, head_mb, tail_mb = MARKER.match(kept[per_part]).groups()
    assert len(kept) == 2 * per_part + 1 and int(dropped) == 1000 - 2 * per_part
    assert float(dropped_mb) == round(int(dropped) * 21 / 2**20, 1)
    assert float(head_mb) == float(tail_mb) == round(per_part * 21 / 2**20, 1)


def test_the_tail_keeps_the_last_line_even_when_it_alone_is_over_the_limit():
    log = KeptLog(limit=LINE_COST)  # a line of 10 characters is over it already
    log.extend(["a" * 10, "b" * 500, "c" * 500])
    assert log.head == [] and list(log.tail) == ["c" * 500] and log.dropped_lines == 2
    assert log.text().endswith("\n" + "c" * 500)


@pytest.mark.parametrize("width", [0, 10, 1000], ids=["empty lines", "short", "long"])
def test_what_is_kept_is_bounded_whatever_the_lines(width):
    """The bound is on what the lines cost Python, so a flood of empty lines (each a slot
    and a str) is bounded as tightly as one of long lines."""
    limit = 64 << 10
    log = KeptLog(limit)
    for _ in range(50):
        log.extend(["x" * width] * 1000)
    kept = len(log.head) + len(log.tail)
    assert kept * (width + LINE_COST) <= 2 * limit
    assert kept + log.dropped_lines == 50_000


def test_clear_starts_an_empty_log_with_the_same_limit():
    log = KeptLog(limit=1000)
    log.extend(_numbered(100))
    log.clear()
    log.extend(["again"])
    assert log.text() == "again" and log.limit == 1000


def test_a_line_without_newline_is_cut_at_the_limit_wherever_the_pipe_splits_it():
    from ddp_lab.launch.output.reader import MAX_LINE_BYTES, LineSplitter
    data = b"a" * (5 * MAX_LINE_BYTES) + b"end\n"
    for chunk in (65536, 999_983, len(data)):
        splitter, lines = LineSplitter(), []
        for start in range(0, len(data), chunk):
            lines += splitter.feed(data[start:start + chunk])[0]
            assert splitter._size <= MAX_LINE_BYTES  # what it holds stays bounded
        assert lines == ["a" * MAX_LINE_BYTES] * 5 + ["end"], chunk


def test_a_cut_splits_no_character():
    from ddp_lab.launch.output.reader import MAX_LINE_BYTES, LineSplitter
    euro = "\N{EURO SIGN}"  # three bytes in UTF-8; MAX_LINE_BYTES is no multiple of three
    text = euro * (MAX_LINE_BYTES // 3 * 2)
    lines, _ = LineSplitter().feed(text.encode() + b"\n")
    assert "".join(lines) == text and all(len(line.encode()) <= MAX_LINE_BYTES for line in lines)
