"""How many times the stress and repeat tests run: a gate's count by default, a soak's count
one variable away.

A gate of N runs catches a failure that strikes 1 run in 100 with probability
1 - 0.99**N: 100 runs expect one such failure and see it 63% of the time (95% over three CI
runs); a soak of 1000 sees it every time but one in 23,000. ``DDP_LAB_SOAK=1`` gives every
test its soak count; a test's own variable (``DDP_LAB_STRESS_RUNS=N``, ...) sets just that one.
"""

from __future__ import annotations

import os

GATE_RUNS = 100
SOAK_RUNS = 1000


def runs(variable: str, gate: int = GATE_RUNS, soak: int = SOAK_RUNS) -> int:
    """``$variable`` if set, else the soak count under ``DDP_LAB_SOAK=1``, else the gate's."""
    if os.environ.get(variable):
        return int(os.environ[variable])
    return soak if os.environ.get("DDP_LAB_SOAK") == "1" else gate
