"""``ddp-lab bench launch``: what one 4-rank all_reduce round trip costs to launch.

Four ways, measured in one run on this machine so the ratios compare like with like:
torchrun --standalone, a torch.multiprocessing.spawn script, ddp_lab.run cold (a fresh
Python process making its first call) and ddp_lab.run warm (later calls in one process).
And the first three calls of a fresh process one by one: the second must already be warm
(within TARGET_SECOND_CALL_RATIO of the third), as in a notebook's second cell.
"""

from __future__ import annotations

import os
import shutil
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from ddp_lab.launch.network.isolation import prefix
from ddp_lab.scripts import script_path

TARGET_WARM_SPEEDUP = 15.0   # warm must be at least this many times faster than torchrun
TARGET_COLD_RATIO = 0.6      # cold may take at most this fraction of torchrun's time
TARGET_SECOND_CALL_RATIO = 2.0  # a fresh process's call 2: at most this many times call 3
FIRST_CALLS = ("ddp_lab call 1", "ddp_lab call 2", "ddp_lab call 3")
COLD_CODE = ("import ddp_lab; from ddp_lab.course.ch00_launching.launching import all_reduce_ranks; "
             "ddp_lab.run(all_reduce_ranks, world_size={n}, echo=False)")
CALLS_CODE = ("import json, time, ddp_lab; "
              "from ddp_lab.course.ch00_launching.launching import all_reduce_ranks\n"
              "def call():\n    start = time.perf_counter()\n"
              "    ddp_lab.run(all_reduce_ranks, world_size={n}, echo=False)\n"
              "    return time.perf_counter() - start\n"
              "print(json.dumps([call() for _ in range({calls})]))")


@dataclass(frozen=True)
class LaunchTimes:
    """Wall seconds of every repeat, per launcher, in the order measured."""

    world_size: int
    seconds: dict = field(default_factory=dict)

    def median(self, launcher: str) -> float:
        return statistics.median(self.seconds[launcher])

    @property
    def warm_speedup(self) -> float:
        return self.median("torchrun") / self.median("ddp_lab warm")

    @property
    def cold_ratio(self) -> float:
        return self.median("ddp_lab cold") / self.median("torchrun")

    @property
    def second_call_ratio(self) -> float:
        return self.median("ddp_lab call 2") / self.median("ddp_lab call 3")


def measure_launches(world_size: int = 4, repeats: int = 3, warm_repeats: int = 10,
                     progress=None) -> LaunchTimes:
    """Time each launcher; ``progress(name, seconds)`` is told of every measurement."""
    times = LaunchTimes(world_size)
    with tempfile.TemporaryDirectory(prefix=f"ddp_lab_bench-{os.getpid()}-") as log_dir:
        private = list(prefix(wildcard=True))  # the peers' stores: nobody else's to reach
        commands = {
            "torchrun": [*private, *torchrun_command(world_size, log_dir)],
            "mp.spawn script": [*private, sys.executable, script_path("mp_spawn_all_reduce.py"),
                                str(world_size)],
            "ddp_lab cold": [sys.executable, "-c", COLD_CODE.format(n=world_size)],  # its own
        }
        for name, command in commands.items():
            times.seconds[name] = [_tell(progress, name, time_command(command))
                                   for _ in range(repeats)]
    for _ in range(repeats):
        for name, seconds in zip(FIRST_CALLS, time_first_calls(world_size, len(FIRST_CALLS))):
            times.seconds.setdefault(name, []).append(_tell(progress, name, seconds))
    times.seconds["ddp_lab warm"] = [_tell(progress, "ddp_lab warm", t)
                                     for t in time_warm_runs(world_size, warm_repeats)]
    return times


def torchrun_command(world_size: int, log_dir: str) -> list[str]:
    """torchrun on the all_reduce script, its logs in ``log_dir``: without ``--log-dir``
    every run leaves a new /tmp/torchelastic_* folder behind
    (torch/distributed/elastic/multiprocessing/api.py, ``tempfile.mkdtemp``)."""
    return [torchrun_path(), "--standalone", f"--nproc-per-node={world_size}",
            f"--log-dir={log_dir}", script_path("all_reduce_once.py")]


def time_command(command: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, timeout=300, env=_quiet_env())
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return time.perf_counter() - start


def time_first_calls(world_size: int, calls: int) -> list[float]:
    """Wall seconds of each of the first ``calls`` calls of a fresh Python process (call 1
    starts the fork server)."""
    done = subprocess.run([sys.executable, "-c", CALLS_CODE.format(n=world_size, calls=calls)],
                          capture_output=True, text=True, timeout=300, env=_quiet_env())
    if done.returncode != 0:
        raise RuntimeError(f"timing a fresh process's first calls failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def time_warm_runs(world_size: int, repeats: int) -> list[float]:
    import ddp_lab
    from ddp_lab.course.ch00_launching.launching import all_reduce_ranks
    ddp_lab.run(all_reduce_ranks, world_size=world_size, echo=False)  # the warm-up call
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        ddp_lab.run(all_reduce_ranks, world_size=world_size, echo=False)
        times.append(time.perf_counter() - start)
    return times


def torchrun_path() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "torchrun")
    return beside if os.path.exists(beside) else (shutil.which("torchrun") or "torchrun")


def _quiet_env() -> dict[str, str]:
    return {**os.environ, "PYTHONWARNINGS": "ignore"}


def _tell(progress, name: str, seconds: float) -> float:
    if progress is not None:
        progress(name, seconds)
    return seconds


def missed_targets(times: LaunchTimes) -> list[str]:
    """The targets this measurement missed, by name; the command exits non-zero on any."""
    missed = []
    if times.warm_speedup < TARGET_WARM_SPEEDUP:
        missed.append("warm speed-up")
    if times.cold_ratio > TARGET_COLD_RATIO:
        missed.append("cold ratio")
    if times.second_call_ratio > TARGET_SECOND_CALL_RATIO:
        missed.append("second call")
    return missed


def format_report(times: LaunchTimes) -> str:
    base = times.median("torchrun")
    lines = [f"launch + {times.world_size}-rank all_reduce round trip (median of repeats)",
             f"{'launcher':<18}{'median s':>10}{'min s':>9}{'vs torchrun':>13}"]
    for name, values in times.seconds.items():
        median = statistics.median(values)
        lines.append(f"{name:<18}{median:>10.3f}{min(values):>9.3f}{median / base:>12.3f}x")
    missed = missed_targets(times)
    warm_ok, cold_ok = "warm speed-up" not in missed, "cold ratio" not in missed
    second_ok = "second call" not in missed
    lines += ["",
              f"warm is {times.warm_speedup:.1f}x faster than torchrun "
              f"(target >= {TARGET_WARM_SPEEDUP:g}x): {'met' if warm_ok else 'MISSED'}",
              f"cold takes {times.cold_ratio:.2f}x torchrun's time "
              f"(target <= {TARGET_COLD_RATIO:g}x): {'met' if cold_ok else 'MISSED'}",
              f"a fresh process's call 2 takes {times.second_call_ratio:.2f}x its call 3 "
              f"(target <= {TARGET_SECOND_CALL_RATIO:g}x): {'met' if second_ok else 'MISSED'}"]
    return "\n".join(lines)
