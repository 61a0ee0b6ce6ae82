"""The latency-bandwidth (alpha-beta) model of a transfer or a collective, t(size) =
alpha + beta * size, and its fit to measured times: notebook 04 fits it to each all-reduce
algorithm on a shaped link, notebook 14 to the collectives of each parallel plan."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AlphaBeta:
    """t(size) = alpha + beta * size, fitted by least squares on relative error (so 1 KiB
    counts as much as 64 MiB); r2 is the coefficient of determination of log t."""

    alpha: float
    beta: float
    r2: float
    max_rel_error: float

    def predict(self, size: float) -> float:
        return self.alpha + self.beta * size


def fit_alpha_beta(sizes, seconds) -> AlphaBeta:
    a = torch.tensor([[1.0 / t, s / t] for s, t in zip(sizes, seconds)], dtype=torch.float64)
    alpha, beta = torch.linalg.lstsq(a, torch.ones(len(sizes), 1, dtype=torch.float64)
                                     ).solution.flatten().tolist()
    predicted = [max(alpha + beta * s, 1e-12) for s in sizes]
    logs, fit_logs = [math.log(t) for t in seconds], [math.log(p) for p in predicted]
    mean = sum(logs) / len(logs)
    total = sum((x - mean) ** 2 for x in logs) or 1.0
    r2 = 1 - sum((x - y) ** 2 for x, y in zip(logs, fit_logs)) / total
    rel = max(abs(p - t) / t for p, t in zip(predicted, seconds))
    return AlphaBeta(alpha, beta, r2, rel)
