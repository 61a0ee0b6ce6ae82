"""08 cell 17/18: per-step 'own work' (before backward) of the fast ranks.

Step 1's forward holds DDP's bucket-rebuild broadcasts, which wait for the slow rank's
forward, so the fast ranks' 'own work' in step 1 is about the straggler's delay.
Run: flock /tmp/ddp-lab-cpu.lock .venv/bin/python docs/reviews/repro/08_straggler_own_work.py
"""
from ddp_lab.course.ch08_when_it_breaks import stragglers

if __name__ == "__main__":
    times = stragglers.measure(world_size=3, delay=0.05, steps=8, echo=False)
    for rank, row in enumerate(times.before_backward):
        print(f"rank {rank}{' (slow)' if rank == times.slow_rank else ''}: before_backward ms per step",
              [round(1e3 * t, 1) for t in row])
    print("mean_ms('before_backward') (steps 1..7):", [round(x, 1) for x in times.mean_ms("before_backward")])
    print("same, steps 2..7:", [round(1e3 * sum(r[2:]) / len(r[2:]), 2) for r in times.before_backward])
