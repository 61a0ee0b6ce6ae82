"""The ping-pong of notebook 02 on a shaped link (``ddp_lab.Network``): does the alpha-beta
fit find the bandwidth the link was given?

Each rank sits in a network namespace of its own with one link to a bridge, shaped by a
token bucket (tc tbf) in both directions. A message from rank 0 to rank 1 leaves through
rank 0's link and arrives through rank 1's; both run at the configured rate, so a large
message takes ``n / bandwidth``. The bucket lets one burst (256 KiB here) through at full
speed and refills at the link's rate: a single small message does not feel the shaping,
messages sent back to back do once they add up to the burst, and a fit of the rate must use
sizes well past it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddp_lab.course.ch02_point_to_point.point_to_point import PingPong, PingPongConfig, ping_pong

# 1 B .. 4 MiB in powers of 4, and 2 MiB: three sizes from FIT_FROM up, so that least squares
# has a point more than a line needs. At 200 Mbit/s a 4 MiB message takes 0.17 s each way.
SHAPED_CONFIG = PingPongConfig(sizes=tuple(sorted({4 ** k for k in range(12)} | {2 << 20})),
                               repeats=3, warmup=1)
FIT_FROM = 1 << 20  # past the token bucket's burst: the slope is the link's rate


@dataclass(frozen=True)
class Fit:
    """t(n) = alpha + n / bandwidth, fitted to the fastest one-way times of large messages."""

    alpha: float  # seconds
    bandwidth: float  # bytes per second

    def time(self, size: float) -> float:
        return self.alpha + size / self.bandwidth


def measure(bandwidth: str = "200mbit", config: PingPongConfig = SHAPED_CONFIG,
            timeout: float = 60.0) -> PingPong:
    import ddp_lab
    res = ddp_lab.run(ping_pong, world_size=2, args=(config,), timeout=timeout, echo=False,
                      network=ddp_lab.Network(bandwidth))
    return PingPong(res.values[0])


def fit_alpha_beta(result: PingPong, from_size: int = FIT_FROM) -> Fit:
    """Least squares of one-way time against size over messages of ``from_size`` or more."""
    points = [(s, t) for s, t in zip(result.sizes, result.latency) if s >= from_size]
    if len(points) < 2:
        raise ValueError(f"need two sizes of at least {from_size} bytes to fit a slope")
    n = len(points)
    mean_s = sum(s for s, _ in points) / n
    mean_t = sum(t for _, t in points) / n
    slope = (sum((s - mean_s) * (t - mean_t) for s, t in points)
             / sum((s - mean_s) ** 2 for s, _ in points))
    return Fit(alpha=mean_t - slope * mean_s, bandwidth=1.0 / slope)
