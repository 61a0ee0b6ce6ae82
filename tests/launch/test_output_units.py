"""The output room's pure parts, no processes: whole lines, progress, the echo's throttle,
the reader of several pipes."""

from __future__ import annotations

import pytest

def test_visible_text_keeps_what_a_terminal_shows():
    from ddp_lab.launch.output.reader import visible_text
    assert visible_text(b"\r 10%|#|\r 20%|##|") == " 20%|##|"
    assert visible_text(b"windows line\r") == "windows line"
    assert visible_text(b"plain") == "plain"


def test_terminal_progress_is_throttled_per_rank(capsys, monkeypatch):
    from ddp_lab.launch.output import echo
    clock = iter([0.0, 1.0, 6.0, 6.5])
    monkeypatch.setattr(echo.time, "monotonic", lambda: next(clock))
    out = echo.PlainEcho()
    for text in ("10%", "20%", "70%"):
        out.status(0, text)
    out.status(1, "5%")
    assert capsys.readouterr().out.splitlines() == ["[rank 0] 10%", "[rank 0] 70%",
                                                    "[rank 1] 5%"]


def test_rank_output_is_split_into_whole_lines_and_progress():
    from ddp_lab.launch.output.reader import LineSplitter
    splitter = LineSplitter()
    assert splitter.feed(b"hel") == ([], None)
    assert splitter.feed(b"lo\nwor") == (["hello"], None)
    assert splitter.feed(b"ld\n\r 10%|#") == (["world"], " 10%|#")
    assert splitter.feed(b"|\r 50%|##|") == ([], " 50%|##|")
    assert splitter.feed(b"\r100%|###|\n") == (["100%|###|"], None)
    assert splitter.feed(b"no newline at the end") == ([], None)
    assert splitter.flush() == ["no newline at the end"] and splitter.flush() == []


@pytest.mark.parametrize("bar", [False, True], ids=["plain line", "redrawn bar"])
def test_a_long_line_in_small_chunks_is_scanned_a_bounded_number_of_times(monkeypatch, bar):
    """Linear cost, counted rather than timed: every byte fed reaches the line scanner
    (visible_text) a bounded number of times, however small the chunks (the quadratic
    version re-joined and re-scanned the whole partial line on every chunk)."""
    from ddp_lab.launch.output import reader as output
    monkeypatch.setattr(output, "MAX_LINE_BYTES", 4 << 20)  # no cut: it has tests of its own
    scanned = []
    real = output.visible_text
    monkeypatch.setattr(output, "visible_text", lambda raw: scanned.append(len(raw)) or real(raw))
    splitter, fed, chunks = output.LineSplitter(), 0, 200_000  # 2 MB, 10 bytes at a time
    for i in range(chunks):
        chunk = b"\r123456789" if bar and i % 1000 == 0 else b"0123456789"
        fed += len(chunk)
        splitter.feed(chunk)
    # the unfinished line is held as the pieces it came in, never re-joined per chunk
    assert len(splitter._pieces) == (chunks if not bar else chunks % 1000 or 1000)
    lines, _ = splitter.feed(b"\n")
    assert len(lines) == 1 and len(lines[0]) <= fed
    # each byte once or twice as a line, plus at most one short status redraw per chunk
    assert sum(scanned) <= 2 * fed + chunks * output.MAX_STATUS_BYTES


def test_reader_reads_pipes_to_their_end_and_routes_pieces():
    import os
    import time
    from ddp_lab.launch.output.reader import Output, OutputReader
    reader = OutputReader()
    plain_r, plain_w = os.pipe()
    routed_r, routed_w = os.pipe()
    reader.add(plain_r, owner=0)
    reader.add(routed_r, route=lambda chunk: [(c, bytes([c]) + b"\n") for c in chunk])
    assert reader.read(until=time.monotonic() + 0.05) == []  # nothing yet: the deadline
    os.write(plain_w, b"a\nunfinished")
    os.write(routed_w, b"xy")
    os.close(plain_w)
    os.close(routed_w)
    seen = []
    while reader.open:
        seen += reader.read(until=time.monotonic() + 5)
    assert [o for o in seen if o.owner == 0] == [Output(0, ["a"]), Output(0, ["unfinished"])]
    assert [o for o in seen if o.owner != 0] == [Output(ord("x"), ["x"]), Output(ord("y"), ["y"])]
    reader.close()
    reader.close()  # idempotent


def test_the_heartbeat_writes_through_the_echo_only(capsys, monkeypatch):
    """One writer to the cell: the heartbeat hands its line to the echo, after the rank lines
    the echo still holds."""
    from ddp_lab.launch.output import echo, heartbeat
    now = [100.0]
    monkeypatch.setattr(echo.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(heartbeat.time, "monotonic", lambda: now[0])
    shown = echo.NotebookEcho()
    written = []
    monkeypatch.setattr(shown, "write", written.append)
    beat = heartbeat.Heartbeat(shown, timeout=60.0, started=100.0, running=lambda: [0, 1])
    shown.show(0, ["a line"])
    shown.show(1, ["held back"])  # batched: the echo writes at most every BATCH_EVERY_S
    now[0] = 100.0 + heartbeat.FIRST_BEAT_S
    beat.maybe_beat()
    assert "".join(written) == ("[rank 0] a line\n[rank 1] held back\n"
                                "[ddp_lab] 10 s: ranks 0-1 still running (timeout 60 s)\n")
    assert capsys.readouterr().out == ""
    assert beat.next_at() == 100.0 + 2 * heartbeat.FIRST_BEAT_S


def test_the_run_loop_reads_until_the_next_thing_is_due():
    import os
    import time

    from ddp_lab.launch.output.echo import SilentEcho
    from ddp_lab.launch.output.reader import OutputReader
    from ddp_lab.launch.output.run_loop import RunLoop
    reader, taken, steps = OutputReader(), [], []
    read_end, write_end = os.pipe()
    reader.add(read_end, owner=0)
    os.write(write_end, b"one\ntwo\n")
    os.close(write_end)

    def step(now: float) -> float:
        steps.append(now)
        return now + 0.01

    RunLoop(reader, SilentEcho(), lambda out: taken.extend(out.lines)).run(
        lambda: reader.open and len(steps) < 50, step)
    assert taken == ["one", "two"] and not reader.open
    assert steps == sorted(steps) and steps[-1] <= time.monotonic()
