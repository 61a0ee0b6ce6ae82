"""Notebook 09, part 3: elastic membership. A job started with ``--nnodes=1:2`` runs on
the first node alone, and when a second node joins, torchrun stops the workers, runs a new
rendezvous and restarts them in a bigger world; the script resumes from its own state.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ddp_lab.launch.torchrun.agents import AgentsResult, run_agents
from ddp_lab.course.ch09_torchrun.multinode import Cluster, cluster_agents, print_commands


@dataclass(frozen=True)
class ElasticRun:
    """The agents' result, plus one record per worker and step (see elastic_steps.py)."""

    agents: AgentsResult
    trace: list[dict]

    def world_sizes(self) -> list[int]:
        """The world sizes the job ran at, in order of time."""
        sizes: list[int] = []
        for record in sorted(self.trace, key=lambda r: r["start"]):
            if not sizes or sizes[-1] != record["world_size"]:
                sizes.append(record["world_size"])
        return sizes

    def steps_done(self) -> list[int]:
        """Every step that completed at least once (a step cut short by a restart is
        done again): 0..steps-1 when the job finished."""
        return sorted({r["step"] for r in self.trace})


def late_join(cluster: Cluster, steps: int = 30, step_s: float = 0.2, hold_at: int = 10,
              timeout: float = 150.0) -> ElasticRun:
    """node0 starts the job alone (``--nnodes=1:2``); node1 starts once node0's workers
    are running, and joins at the next rendezvous. node0's first round waits at step
    ``hold_at`` for that, however long node1 takes to start."""
    with tempfile.TemporaryDirectory(prefix=f"ddp_lab-{os.getpid()}-") as folder:
        trace = Path(folder, "trace.jsonl")
        target = ["-m", "ddp_lab.scripts.elastic_steps", "--steps", str(steps),
                  "--step-s", str(step_s), "--state", str(Path(folder, "state.json")),
                  "--trace", str(trace), "--hold-at-step", str(hold_at),
                  "--hold-for-world", "4"]  # 2 nodes x 2 workers (cluster_agents)
        # last_call_timeout: once the minimum (1 node) is there, wait 1 s, not 30, for more.
        # TORCH_DISABLE_SHARE_RDZV_TCP_STORE: in torch 2.13 the rank-0 agent keeps its
        # shared store across rounds and never publishes MASTER_ADDR in the new round's
        # keys (dynamic_rendezvous.next_rendezvous), so a joining node waits 60 s for it
        # and fails; without sharing, every round publishes it again.
        agents = cluster_agents(cluster, target, nnodes="1:2", rdzv_id="nb09-elastic",
                                rdzv_conf=("last_call_timeout=1",), late="restart 0, starting",
                                extra_env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
        print_commands(agents)
        result = run_agents(agents, timeout=timeout)
        records = [json.loads(line) for line in trace.read_text().splitlines()] \
            if trace.exists() else []
    return ElasticRun(result, records)
