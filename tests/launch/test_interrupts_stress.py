"""Ctrl-C at random instants of many runs: set-up, the run, teardown, and in between.

A child process drives ``ddp_lab.run`` in a loop while a timer thread sends it SIGINT at a
random offset (seeded: its seed is printed; ``DDP_LAB_STRESS_SEED`` replays one). After every
run it checks what a kernel would care about: the call raised KeyboardInterrupt if and only
if it was interrupted (never OSError or another error), an uninterrupted call returned the
right values, and no process, descriptor, run folder or /dev/shm entry was left behind.
It runs 100 times in CI (tests/repeats.py sizes it); ``--stress-runs N``,
``DDP_LAB_STRESS_RUNS=N`` or ``DDP_LAB_SOAK=1`` (1000 runs) makes it longer.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap

import pytest

from repeats import runs as repeat_count

RUNS = repeat_count("DDP_LAB_STRESS_RUNS")  # conftest puts --stress-runs there

DRIVER = textwrap.dedent(r"""
    import glob, json, os, random, signal, statistics, sys, tempfile, threading, time
    import psutil
    import ddp_lab
    from ddp_lab.launch.interrupts import deferred
    from ddp_lab.launch.forkserver.client import launcher_pids

    def scaled(x):
        import torch.distributed as dist
        return (dist.get_rank() + 1) * x

    def once(i, offset):
        fired = []
        def fire():
            fired.append(True)
            os.kill(os.getpid(), signal.SIGINT)
        timer = threading.Timer(offset, fire) if offset is not None else None
        try:
            try:
                if timer:
                    timer.start()
                values = ddp_lab.run(scaled, 2, args=(i,), timeout=60, echo=False).values
            finally:
                with deferred():  # a SIGINT sent until join() returns is raised after it
                    if timer:
                        timer.cancel()
                        timer.join()
            outcome = "ok" if values == [i, 2 * i] else f"wrong values {values}"
        except KeyboardInterrupt:
            outcome = "interrupted"
        except BaseException as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        return outcome, bool(fired)

    def fds():
        return sorted(os.listdir("/proc/self/fd"), key=int)

    def leftovers():
        keep = launcher_pids()  # the fork server and its store host
        found = []
        for p in psutil.Process().children(recursive=True):
            try:
                if p.pid not in keep and p.status() != psutil.STATUS_ZOMBIE:
                    found.append((p.pid, " ".join(p.cmdline())[:80]))
            except psutil.Error:
                pass
        return found

    def state():
        folders = glob.glob(os.path.join(tempfile.gettempdir(), f"ddp_lab-{os.getpid()}-*"))
        return {"fds": len(fds()), "processes": leftovers(), "folders": folders}

    def settled(baseline):
        deadline = time.monotonic() + 5  # the store's thread and the reader may lag a little
        now = state()
        while now != baseline and time.monotonic() < deadline:
            time.sleep(0.05)
            now = state()
        return now

    seed, runs = int(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    shm_before = set(os.listdir("/dev/shm"))
    for i in range(3):  # warm: the fork server and its imports, the first runs
        assert once(i + 1, None)[0] == "ok"
    durations = []
    for i in range(5):  # then time warm runs: the span the interrupts are spread over
        start = time.monotonic()
        assert once(i + 4, None)[0] == "ok"
        durations.append(time.monotonic() - start)
    span = 1.3 * statistics.median(durations)
    baseline = {"fds": len(fds()), "processes": [], "folders": []}
    counts, problems = {"ok": 0, "interrupted": 0}, []
    for i in range(runs):
        offset = rng.uniform(0, span) if rng.random() < 0.85 else None
        outcome, fired = once(i + 10, offset)
        if fired != (outcome == "interrupted") or outcome not in counts:
            problems.append(f"run {i} (offset {offset}): {outcome}, fired={fired}")
        counts[outcome] = counts.get(outcome, 0) + 1
        now = settled(baseline)
        if now != baseline:
            problems.append(f"run {i} (offset {offset}) left {now}, baseline {baseline}")
            baseline = now
    # a resource tracker's last unlink takes a moment; so do the short-lived entries of
    # other programs on the machine (a DataLoader's workers), which are no leak of ours
    deadline = time.monotonic() + 5
    while (shm_left := sorted(set(os.listdir("/dev/shm")) - shm_before)) and \
            time.monotonic() < deadline:
        time.sleep(0.2)
    print(json.dumps({"counts": counts, "span": span, "problems": problems,
                      "shm_left": shm_left}))
""")


@pytest.mark.slow
@pytest.mark.alone  # /dev/shm is the machine's: another worker's runs would show there
@pytest.mark.timeout(120 + 3 * RUNS)  # a hang guard: about 0.5 s a run on 2 busy cores
def test_ctrl_c_at_random_instants_never_leaks_and_always_raises_keyboard_interrupt():
    seed = int(os.environ.get("DDP_LAB_STRESS_SEED", random.randrange(1 << 30)))
    print(f"stress: {RUNS} runs, seed {seed} (DDP_LAB_STRESS_SEED={seed} replays it)")
    driver = subprocess.run([sys.executable, "-c", DRIVER, str(seed), str(RUNS)],
                            capture_output=True, text=True, timeout=100 + 3 * RUNS)
    assert driver.returncode == 0, driver.stderr[-3000:]
    summary = json.loads(driver.stdout.strip().splitlines()[-1])
    print(summary["counts"], f"offsets up to {summary['span']:.3f} s")
    assert summary["problems"] == [], f"seed {seed}: " + "\n".join(summary["problems"][:20])
    assert summary["shm_left"] == [], f"seed {seed}: /dev/shm entries left behind"
    counts = summary["counts"]
    assert counts["ok"] >= RUNS // 20 and counts["interrupted"] >= RUNS // 4, counts
