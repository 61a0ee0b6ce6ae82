"""The reference solutions of 00, 00b and 02 pass their own checkers (one fresh seed each).
Run from the root of a checkout of 46d1faf:
flock /tmp/ddp-lab-cpu.lock .venv/bin/python docs/reviews/repro/00_02_references_pass.py"""
from ddp_lab.exercises.registry import find

for name in ("00.max_over_ranks", "00b.weights_agree", "02.all_gather", "02.shift"):
    exercise = find(name)
    try:
        print(name, "->", exercise.checker(exercise.solution))
    except BaseException as exc:  # noqa: BLE001
        print(name, "FAILED:", type(exc).__name__, str(exc)[:400])
