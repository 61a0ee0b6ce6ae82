"""Notebook 08, part 2: one slow rank, and the process group's timeout ("skewed processing
speeds" in PyTorch's DDP tutorial, https://pytorch.org/tutorials/intermediate/ddp_tutorial.html).

DDP's all-reduce in ``backward()`` is a synchronization point: every rank leaves it when
the slowest one has arrived, so one straggler sets the pace of the whole job. The fast ranks
wait inside the collective, and a wait longer than ``init_process_group(timeout=...)`` ends
the job. The ranks run ``scripts/straggler.py`` because each must create its own process
group with the timeout under test (``ddp_lab.run`` would have initialized one already).
"""

from __future__ import annotations

from dataclasses import dataclass

from ddp_lab.scripts import script_path

SCRIPT = script_path("straggler.py")


def straggler_args(*, delay: float, steps: int, pg_timeout: float = 60.0,
                   slow_rank: int = -1) -> list[str]:
    """Command-line arguments for ``straggler.py`` (also valid under torchrun)."""
    return ["--delay", str(delay), "--steps", str(steps), "--pg-timeout", str(pg_timeout),
            "--slow-rank", str(slow_rank)]


@dataclass(frozen=True)
class StepTimes:
    """Per-rank step times of one run: ``step[r][i]`` seconds for rank r's step i, of which
    ``before_backward[r][i]`` came before ``backward()`` and ``through_backward[r][i]`` up to
    its end (backward holds the all-reduce; the rest of the step is ``optimizer.step()``)."""

    step: list[list[float]]
    before_backward: list[list[float]]
    through_backward: list[list[float]]
    slow_rank: int
    delay: float

    #: steps left out of the means: step 0 runs with one bucket and pays first-touch
    #: allocation and autograd warm-up; step 1's forward rebuilds the buckets with two
    #: broadcasts, collectives in which the fast ranks' "own work" waits for the straggler
    WARMUP_STEPS = 2

    @classmethod
    def from_values(cls, values: list[dict], delay: float) -> "StepTimes":
        slow = next(v["rank"] for v in values if v["slow"])
        return cls([v["step"] for v in values], [v["before_backward"] for v in values],
                   [v["through_backward"] for v in values], slow, delay)

    def mean_ms(self, which: str = "step") -> list[float]:
        """Mean per rank in ms over steps ``WARMUP_STEPS`` and later."""
        rows, skip = getattr(self, which), self.WARMUP_STEPS
        if any(len(r) <= skip for r in rows):
            raise ValueError(f"mean_ms: run more than {skip} steps; the first {skip} are "
                             "left out (one bucket, then the bucket rebuild's broadcasts)")
        return [1e3 * sum(r[skip:]) / (len(r) - skip) for r in rows]

    def waiting_ms(self) -> list[float]:
        """Mean time per step each rank spent in ``backward()``: mostly waiting."""
        return [t - b for t, b in zip(self.mean_ms("through_backward"),
                                      self.mean_ms("before_backward"))]

    def optimizer_ms(self) -> list[float]:
        """Mean time per step each rank spent in ``optimizer.step()`` (after backward)."""
        return [s - t for s, t in zip(self.mean_ms("step"), self.mean_ms("through_backward"))]


def measure(world_size: int = 3, delay: float = 0.05, steps: int = 8, **run_kwargs) -> StepTimes:
    """Run the straggler script once and collect every rank's step times."""
    import ddp_lab
    res = ddp_lab.run_script(SCRIPT, world_size, script_args=straggler_args(
        delay=delay, steps=steps), **{"timeout": 60.0, **run_kwargs})
    return StepTimes.from_values(res.values, delay)
