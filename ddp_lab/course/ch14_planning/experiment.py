"""Notebook 14's experiment, in one run of 4 ranks on a shaped link: calibrate (collectives
and compute), then every plan for real; the predictions are made from the calibration alone
and set beside what was measured."""

from __future__ import annotations

from ddp_lab.course.ch14_planning import calibrate, measure
from ddp_lab.course.ch14_planning.costs import predicted_calls, predicted_state
from ddp_lab.course.ch14_planning.plans import PLANS, PlanConfig
from ddp_lab.course.ch14_planning.timemodel import all_shapes, predicted_seconds


def on_rank(config: PlanConfig, names) -> dict:
    return {"collectives": calibrate.collective_seconds(),
            "compute": calibrate.compute_seconds(all_shapes(config, names), config),
            "plans": measure.run_plans(config, names),
            "activations": measure.data_parallel_activations(config)}


def run(bandwidth: str = "400mbit", config: PlanConfig = PlanConfig(), names=PLANS,
        timeout: float = 120.0) -> dict:
    """{"fits", "compute", "per_rank" (each rank's measured plans), "activations" (each
    rank's saved bytes in a data-parallel forward, plain and checkpointed), "predicted" {plan: seconds
    split}, "measured_ms" {plan: ms}, "bandwidth"}. Compute is rank 0's measurement (the
    ranks share the cores alike). ``bandwidth`` None: plain loopback (the tests)."""
    import ddp_lab
    values = ddp_lab.run(on_rank, world_size=4, args=(config, tuple(names)), timeout=timeout,
                         network=ddp_lab.Network(bandwidth) if bandwidth else None,
                         echo=False).values
    fits = calibrate.fit(values[0]["collectives"])
    compute = values[0]["compute"]
    return {"bandwidth": bandwidth or "loopback", "config": config, "fits": fits, "compute": compute,
            "collectives": values[0]["collectives"],
            "per_rank": [v["plans"] for v in values],
            "activations": [v["activations"] for v in values],
            "predicted": {n: predicted_seconds(n, config, fits, compute) for n in names},
            "measured_ms": {n: values[0]["plans"][n]["ms"] for n in names}}


def trace_mismatches(result: dict) -> list:
    """(plan, rank) where the traced collectives differ from the cost model's list."""
    return [(name, rank) for rank, plans in enumerate(result["per_rank"])
            for name, got in plans.items()
            if [tuple(c) for c in got["calls"]] != predicted_calls(name, result["config"], rank)]


def state_mismatches(result: dict) -> list:
    """(plan, rank) where the bytes of state held differ from the memory model's."""
    return [(name, rank) for rank, plans in enumerate(result["per_rank"])
            for name, got in plans.items()
            if got["state"] != predicted_state(name, result["config"], rank)]


def ratios(result: dict) -> dict:
    """{plan: measured / predicted step time}."""
    return {n: result["measured_ms"][n] / (p["total"] * 1e3) for n, p in result["predicted"].items()}
