"""What the caller and the ranks agree on: the run's settings, one rank's instructions, the
environment a rank starts with, and the layout of the run folder through which results,
errors and stacks come back.

Both sides import this module (the kernel to launch and read, every rank to write), so it
stays as light as the rank side must be: no torch, no launcher machinery.

The environment: torchrun's variables, networking kept on loopback, a fair share of the
cores, and this very ddp_lab on the import path. Both launchers build on it, so a script
sees the same world under ``ddp_lab`` and under ``launcher="torchrun"``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ddp_lab.launch.network.placement import LOOPBACK, Placement
from ddp_lab.launch.verdict import plain_values

# Names the run folder in every rank's environment: ``ddp_lab.report`` writes there, and
# torchrun passes it on to its workers, so the same script reports under both launchers.
RUN_DIR_VAR = "DDP_LAB_RUN_DIR"
RUN_DIR_PREFIX = "ddp_lab-"  # then the launcher's pid: new_run_dir

LOG_LIMIT_BYTES = 5 << 20
"""How much of each rank's output the kernel keeps at each end (output/kept_log.py): its
first 5 MB and its last 5 MB, the lines between counted and dropped. A log read by a
person is far shorter; a rank that prints more is a ``print`` left in a loop, and keeping
it all grew the kernel by a gigabyte in 8 seconds.
At 10 MB a rank, a 16-rank run keeps at most 160 MB."""


@dataclass(frozen=True)
class LaunchConfig:
    """One run as the caller asked for it, checked (checks.py) before anything starts."""

    world_size: int
    backend: str
    timeout: float
    env: dict
    echo: bool = True
    script: str | None = None
    script_args: tuple = ()
    init_group: bool = True  # False for ddp_lab.spawn: fn(rank, ...) initializes its own
    placement: Placement = LOOPBACK  # where the ranks live and talk (network/placement.py)
    log_limit: int = LOG_LIMIT_BYTES  # per rank, of its output's head and of its tail

    @property
    def network(self):
        """The shaped network the caller asked for (network.Network), None for loopback."""
        return self.placement.network


@dataclass(frozen=True)
class RankSpec:
    """Everything a forked rank needs to become the process the user's code expects."""

    rank: int
    world_size: int
    run_dir: str
    env: dict
    cwd: str
    sys_path: tuple
    backend: str
    threads: int
    pg_timeout_s: float
    script: str | None = None  # None: call the pickled function in run_dir/payload.pkl
    script_args: tuple = ()
    init_group: bool = True
    network: bool = False  # forked into a namespace of its own: placement.rank_netns
    gpu_per_rank: bool = False  # NCCL moves CUDA tensors: the rank owns GPU LOCAL_RANK
    limits: tuple = ()  # (name, value) resource limits, DDP_LAB_RANK_LIMITS (rank/limits.py)


def rank_spec(config: LaunchConfig, rank: int, run_dir: str, base_env: dict) -> RankSpec:
    """What rank ``rank`` of this run gets from the fork server: the kernel's working folder
    and import path, the run's environment with its own rank, a share of the cores."""
    import sys

    from ddp_lab.launch.backends import uses_nccl
    c = config
    return RankSpec(rank=rank, world_size=c.world_size, run_dir=run_dir,
                    env=c.placement.rank_env(rank_env(base_env, rank), rank), cwd=os.getcwd(),
                    sys_path=tuple(sys.path),
                    backend=c.backend, threads=threads_per_rank(c.world_size),
                    pg_timeout_s=c.timeout + 60.0, script=c.script, script_args=c.script_args,
                    init_group=c.init_group, network=c.placement.rank_netns,
                    gpu_per_rank=uses_nccl(c.backend), limits=rank_limits(base_env))


def rank_limits(env: dict[str, str]) -> tuple:
    """The resource limits ``env`` asks every rank to run under (checked before the run:
    checks.check_switches)."""
    from ddp_lab.launch.rank.limits import LIMITS_VAR, parse_limits
    return parse_limits(env.get(LIMITS_VAR, ""))


def new_run_dir() -> str:
    """A new run folder: private (mkdtemp makes it 0700), named after this process so that
    a run's leftovers say whose they are (``ddp_lab-PID-...`` in the temporary folder). The
    caller removes it; ``RunFiles`` says what goes in it."""
    import tempfile
    return tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-")


class RunFiles:
    """Where a rank leaves its result, its error and its stack dump in the run folder."""

    def __init__(self, run_dir: str | os.PathLike):
        self.dir = Path(run_dir)
        self.payload = self.dir / "payload.pkl"
        # the live call a stop-button SIGINT is meant for (live/session.py writes it first)
        self.interrupted_call = self.dir / "interrupted_call"

    def result(self, rank: int) -> Path:
        return self.dir / f"rank{rank}.result.pkl"

    def error(self, rank: int) -> Path:
        return self.dir / f"rank{rank}.error.json"

    def stack(self, rank: int) -> Path:
        return self.dir / f"rank{rank}.stack.txt"

    def finished(self, rank: int) -> Path:
        """Left by a rank once the user's function or script has returned: a death after
        it (in teardown) is told apart from a failure of the user's code."""
        return self.dir / f"rank{rank}.finished"

    def results(self) -> dict:
        """Every result in the folder by global rank: under torchrun the ranks are not
        known in advance (elastic restarts may change the world size)."""
        found = {int(path.name[4:].split(".")[0]): read_pickle(path)
                 for path in self.dir.glob("rank*.result.pkl")}
        return dict(sorted(found.items()))


def write_pickle(path: Path, value) -> None:
    """Pickle ``value`` (by value, with cloudpickle: a notebook's classes travel too) so that
    a reader never sees a half-written file: write aside, then rename over."""
    import cloudpickle
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(cloudpickle.dumps(value))
    os.replace(tmp, path)


def read_pickle(path: Path):
    """What ``write_pickle`` left there, or None when nothing was written (as plain data
    only inside ``plain_values.plain_values()``: a checker's ranks run the learner's code)."""
    try:
        return plain_values.loads(path.read_bytes())
    except FileNotFoundError:
        return None


# -- the environment a rank (or torchrun's agent) starts with ---------------------------
PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent.parent)

# torch 2.13's init_process_group and new_group end with a store-based barrier only when
# this is 1 (torch/distributed/distributed_c10d.py: _is_barrier_after_init, read at the end
# of init_process_group; off by default since 04/2023 because it costs at scale). Without
# it a rank whose fn runs no collective can return and close its gloo sockets while a peer
# is still in connectFullMesh, which then fails with "Connection closed by peer" (4 to 8
# runs in 500 of a 4-rank no-op on 2 cores; 0 in 1000 with the barrier).
INIT_BARRIER_VAR = "TORCH_DIST_INIT_BARRIER"


def loopback_env(config: LaunchConfig, interface: str | None = None) -> dict[str, str]:
    """This process's environment with gloo and NCCL kept off the network (one machine;
    a shaped run: on the rank's link) and a barrier after process-group set-up, then the
    caller's ``env=``, which may override all three."""
    interface = interface or loopback_interface()
    return {**os.environ, "GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface,
            INIT_BARRIER_VAR: "1", **config.env}


def run_env(config: LaunchConfig, port: int, run_dir: str,
            address: str = "127.0.0.1") -> dict[str, str]:
    """The environment torchrun would give every rank, plus loopback-only networking (a
    shaped run: the store is at ``address`` on the bridge, traffic on each rank's link)."""
    env = loopback_env(config, config.placement.interface)
    n = config.world_size
    env.update({
        "GROUP_RANK": "0", "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n),
        "ROLE_WORLD_SIZE": str(n), "MASTER_ADDR": address, "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True", "OMP_NUM_THREADS": str(threads_per_rank(n)),
        "PYTHONUNBUFFERED": "1", RUN_DIR_VAR: run_dir,
    })
    return env


def rank_env(base_env: dict[str, str], rank: int) -> dict[str, str]:
    return {**base_env, "RANK": str(rank), "LOCAL_RANK": str(rank), "ROLE_RANK": str(rank)}


def threads_per_rank(world_size: int) -> int:
    """Ranks share the cores: oversubscribed OpenMP threads make collectives crawl."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // world_size)


def loopback_interface() -> str:
    import psutil
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == "127.0.0.1" for a in addresses):
            return name
    return "lo"


def package_pythonpath(env: dict[str, str]) -> str:
    """``env``'s PYTHONPATH with this ddp_lab's folder first: the fork server, torchrun's
    agent and their workers import this very copy, installed or not."""
    return os.pathsep.join(filter(None, [PACKAGE_ROOT, env.get("PYTHONPATH")]))
