"""Notebook 09b, part 2: torchrun's other ways to start, each run for real on this machine.

- **static** rendezvous (torchrun's default ``--rdzv-backend``, ``static``): every node
  is told ``--nnodes``, its ``--node-rank``, and ``--master-addr/--master-port`` (node 0
  runs the store there); ``RANK = node_rank * nproc_per_node + local_rank``;
- **c10d** rendezvous ignores ``--node-rank`` (``torch/distributed/run.py``, ``config_from_args``
  logs "node_rank is only used for static rdzv_backend"): node ranks are handed out by the
  rendezvous itself, so two nodes may both say ``--node-rank=1``;
- the worker-output options: ``--log-dir`` (one folder per run, attempt and local rank),
  ``--redirects`` (a worker's streams to files only) and ``--tee`` (to files and the
  console), each a bitmask (1 stdout, 2 stderr, 3 both), optionally per local rank
  (``0:3,1:2``);
- ``--no-python`` (the target is an executable, not a Python script) and ``--run-path``
  (the script runs with ``runpy.run_path`` in a worker that multiprocessing starts,
  instead of a fresh ``python -u script``);
- ``--nproc-per-node`` by name (``determine_local_world_size`` in torch/distributed/run.py):
  ``gpu`` is ``torch.cuda.device_count()`` and fails without CUDA; ``auto`` is the
  accelerator's device count, or without one the CPUs this process may run on
  (``torch._utils.cpu_count``: ``os.sched_getaffinity``); ``cpu`` is always the latter;
- ``--virtual-local-rank`` (``_set_local_rank_env`` in
  torch/distributed/elastic/agent/server/local_elastic_agent.py): every worker gets
  ``LOCAL_RANK=0`` and ``CUDA_VISIBLE_DEVICES`` narrowed to the agent's entry at its local
  rank.
"""

from __future__ import annotations

import os
import re
import tempfile
import uuid

from ddp_lab.course.ports import free_loopback_port
from ddp_lab.launch.torchrun.agents import Agent, AgentsResult, ThisMachine, run_agents
from ddp_lab.launch.torchrun.command import TorchrunResult, torchrun
from ddp_lab.scripts import script_path

TARGET = ("-m", "ddp_lab.scripts.print_env")


def static_nodes(nnodes: int = 2, nproc: int = 1, timeout: float = 120.0) -> AgentsResult:
    """``torchrun --nnodes=N --node-rank=i --master-addr=127.0.0.1 --master-port=P ...``
    once per "node", all on this machine."""
    port = free_loopback_port()
    agents = [Agent(ThisMachine(), (f"--nnodes={nnodes}", f"--node-rank={node}",
                                    f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1",
                                    f"--master-port={port}", *TARGET))
              for node in range(nnodes)]
    return run_agents(agents, timeout=timeout, echo=False)


def c10d_same_node_rank(node_rank: int = 1, nproc: int = 1,
                        timeout: float = 120.0) -> AgentsResult:
    """Two c10d agents that BOTH pass ``--node-rank=node_rank``: it is ignored (and said
    so in each agent's log), and the rendezvous gives them group ranks 0 and 1."""
    port, run_id = free_loopback_port(), f"node-rank-{uuid.uuid4().hex[:8]}"
    args = ("--nnodes=2", f"--node-rank={node_rank}", f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}",
            *TARGET)
    return run_agents([Agent(ThisMachine(), args), Agent(ThisMachine(), args)],
                      timeout=timeout, echo=False)


def output_options(log_dir: str, timeout: float = 120.0) -> TorchrunResult:
    """``print_env.py`` started with ``--run-path``, local rank 0 redirected (files only),
    local rank 1 teed (files and console): three options, one run."""
    return torchrun(["--redirects=0:3", "--tee=1:3", "--run-path", script_path("print_env.py")],
                    2, log_dir=log_dir, timeout=timeout)


def log_files(log_dir: str) -> dict[str, str]:
    """Every file torchrun wrote under ``log_dir``, relative path -> its content."""
    files = {}
    for root, _, names in os.walk(log_dir):
        for name in names:
            path = os.path.join(root, name)
            with open(path, errors="replace") as f:
                files[os.path.relpath(path, log_dir)] = f.read()
    return dict(sorted(files.items()))


def nproc_per_node(*values: str, timeout: float = 60.0) -> list[TorchrunResult]:
    """``torchrun --standalone --nproc-per-node=VALUE --no-python printenv LOCAL_WORLD_SIZE``
    for each value, all at once: how many workers a named value gives on this machine
    (``printenv`` workers cost nothing, however many CPUs ``auto`` counts)."""
    agents = [Agent(ThisMachine(), ("--standalone", f"--nproc-per-node={value}", "--no-python",
                                    "printenv", "LOCAL_WORLD_SIZE")) for value in values]
    result = run_agents(agents, timeout=timeout, echo=False)  # logs: a private folder
    return [TorchrunResult(tuple(agent.argv()), code, "".join(f"{line}\n" for line in lines),
                           result.seconds, result.stopped)
            for agent, code, lines in zip(agents, result.returncodes, result.outputs)]


def no_python(timeout: float = 60.0) -> TorchrunResult:
    """``torchrun --no-python printenv RANK LOCAL_RANK WORLD_SIZE``: any executable."""
    with tempfile.TemporaryDirectory(prefix="ddp_lab-torchrun-") as log_dir:
        return torchrun(["--no-python", "printenv", "RANK", "LOCAL_RANK", "WORLD_SIZE"], 2,
                        log_dir=log_dir, timeout=timeout)


def virtual_local_rank(visible: str = "2,3", timeout: float = 60.0) -> dict[int, tuple[str, str]]:
    """``CUDA_VISIBLE_DEVICES=VISIBLE torchrun --virtual-local-rank --no-python printenv
    LOCAL_RANK CUDA_VISIBLE_DEVICES`` on 2 workers: ``{local rank: (LOCAL_RANK,
    CUDA_VISIBLE_DEVICES)}`` as each worker saw them (``--tee`` prefixes its lines)."""
    agent = Agent(ThisMachine(), ("--standalone", "--nproc-per-node=2", "--virtual-local-rank",
                                  "--tee=3", "--no-python", "printenv", "LOCAL_RANK",
                                  "CUDA_VISIBLE_DEVICES"), {"CUDA_VISIBLE_DEVICES": visible})
    result = run_agents([agent], timeout=timeout, echo=False)
    if result.returncodes != [0]:
        raise RuntimeError(f"torchrun --virtual-local-rank failed: {result.outputs[0][-5:]}")
    seen: dict[int, list[str]] = {}
    for line in result.outputs[0]:
        match = re.match(r"\[default(\d+)\]:(.*)", line)
        if match:
            seen.setdefault(int(match[1]), []).append(match[2].strip())
    return {rank: tuple(values) for rank, values in sorted(seen.items())}
