"""08b exercise: the reference first_unjoined says None ("every rank is level") for
records where the ranks are not level, when no ring buffer still holds the stuck seq.
Run: .venv/bin/python docs/reviews/repro/08b_first_unjoined_dropped.py
"""
from ddp_lab.course.ch08_when_it_breaks.exercises_b import first_unjoined

# rank 0 issued 4 (the stuck all_reduce) and two async ones after it; its buffer of 2 kept 5, 6.
# rank 1 never got past 3.
records = {0: [(5, "broadcast"), (6, "all_gather")], 1: [(2, "all_reduce"), (3, "all_reduce")]}
print("reference:", first_unjoined(records))
