"""The environment a rank (or torchrun's agent) starts with: torchrun's variables, networking
kept on loopback, a fair share of the cores, and this very ddp_lab on the import path.

Both launchers build on it, so a script sees the same world under ``ddp_lab`` and under
``launcher="torchrun"``.
"""

from __future__ import annotations

import os
from pathlib import Path

from ddp_lab.launch.config import RUN_DIR_VAR, LaunchConfig

PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent.parent)

# torch 2.13's init_process_group and new_group end with a store-based barrier only when
# this is 1 (torch/distributed/distributed_c10d.py: _is_barrier_after_init, read at the end
# of init_process_group; off by default since 04/2023 because it costs at scale). Without
# it a rank whose fn runs no collective can return and close its gloo sockets while a peer
# is still in connectFullMesh, which then fails with "Connection closed by peer" (4 to 8
# runs in 500 of a 4-rank no-op on 2 cores; 0 in 1000 with the barrier).
INIT_BARRIER_VAR = "TORCH_DIST_INIT_BARRIER"


SHAPED_INTERFACE = "eth0"  # a shaped run's rank: its one link (switch.py)


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
    shaped = config.network is not None
    env = loopback_env(config, SHAPED_INTERFACE if shaped else None)
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
