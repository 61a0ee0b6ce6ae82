"""Notebook 09b, SLURM: the two usual ways to start a multi-node job under ``sbatch``.

(a) ``srun`` starts ONE ``torchrun`` per node, and torchrun starts the workers: its c10d
    rendezvous runs on the job's first node (``scontrol show hostnames
    "$SLURM_JOB_NODELIST" | head -n1``), ``--nnodes=$SLURM_NNODES``, and the job id
    names the rendezvous. ``--node-rank=$SLURM_NODEID`` is customary but ignored under c10d
    (``config_from_args`` in torch/distributed/run.py; section 4 of the notebook shows it),
    and it must be expanded by each task's own shell (``srun bash -c '...'``): written
    after a bare ``srun``, the batch script's shell expands it once, on the first node, and
    every node's torchrun gets ``--node-rank=0``.
(b) ``srun`` starts ONE task per rank and SLURM itself is the launcher: each task turns
    ``SLURM_PROCID``/``SLURM_LOCALID``/``SLURM_NTASKS`` into ``RANK``/``LOCAL_RANK``/
    ``WORLD_SIZE`` and calls ``init_process_group(init_method="env://")``.

There is no SLURM here, so the mappings are pure functions of a SLURM environment (a dict,
as ``os.environ`` would be inside ``srun``), and ``expand_hostlist`` does what ``scontrol
show hostnames`` does with a compressed node list. ``srun_env`` builds the variables srun
gives each task of a block distribution, so (b) runs for real on this machine
(``per_task_run``). The sbatch scripts are text, made from the same tables, and
``sbatch_dry_run`` runs that text through bash the way sbatch and srun would, with
stand-ins for ``scontrol``, ``srun``, ``torchrun`` and ``python`` that print what each task
would start.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Mapping

from ddp_lab.course.ports import free_loopback_port
from ddp_lab.launch.torchrun.agents import Agent, AgentsResult, ThisMachine, run_agents

# (b): what each task exports before it starts Python (torch's env:// reads these).
PER_TASK_VARS = {"RANK": "SLURM_PROCID", "LOCAL_RANK": "SLURM_LOCALID",
                 "WORLD_SIZE": "SLURM_NTASKS"}
RDZV_PORT = 29500
# In a script: a port of the job's own, so that two jobs that share a first node differ.
JOB_PORT = "$((29500 + SLURM_JOB_ID % 1000))"


def expand_hostlist(nodelist: str) -> list[str]:
    """``scontrol show hostnames``: ``"gpu[01-03,07],login1"`` -> gpu01 gpu02 gpu03 gpu07
    login1. Ranges keep their zero padding; several bracket groups in one name multiply."""
    hosts: list[str] = []
    for name in _split_top_level(nodelist):
        hosts += _expand_name(name)
    return hosts


def _split_top_level(nodelist: str) -> list[str]:
    """Split at the commas that are not inside brackets."""
    names, depth, current = [], 0, ""
    for char in nodelist:
        depth += (char == "[") - (char == "]")
        if char == "," and depth == 0:
            names.append(current)
            current = ""
        else:
            current += char
    return [n for n in names + [current] if n]


def _expand_name(name: str) -> list[str]:
    match = re.search(r"\[([^\]]+)\]", name)
    if match is None:
        return [name]
    head, tail = name[:match.start()], name[match.end():]
    return [head + value + rest for value in _expand_ranges(match[1])
            for rest in _expand_name(tail)]


def _expand_ranges(ranges: str) -> list[str]:
    values = []
    for part in ranges.split(","):
        first, _, last = part.partition("-")
        width = len(first)
        values += [str(n).zfill(width) for n in range(int(first), int(last or first) + 1)]
    return values


def head_node(slurm: Mapping[str, str]) -> str:
    """The job's first node: where the rendezvous (a) or the store (b) runs."""
    return expand_hostlist(slurm["SLURM_JOB_NODELIST"])[0]


def torchrun_args(slurm: Mapping[str, str], nproc_per_node: int | str,
                  rdzv_port: int = RDZV_PORT) -> list[str]:
    """(a): the arguments of the one ``torchrun`` that srun starts on each node."""
    return [f"--nnodes={slurm['SLURM_NNODES']}", f"--node-rank={slurm['SLURM_NODEID']}",
            f"--nproc-per-node={nproc_per_node}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={head_node(slurm)}:{rdzv_port}",
            f"--rdzv-id={slurm['SLURM_JOB_ID']}"]


def env_for_task(slurm: Mapping[str, str], master_port: int = RDZV_PORT) -> dict[str, str]:
    """(b): the ``env://`` variables of one srun task, from its SLURM variables."""
    env = {name: slurm[source] for name, source in PER_TASK_VARS.items()}
    return {**env, "MASTER_ADDR": head_node(slurm), "MASTER_PORT": str(master_port)}


def srun_env(nodes: list[str], tasks_per_node: int, job_id: str = "4242",
             nodelist: str | None = None) -> list[dict[str, str]]:
    """What srun sets for each task of ``--nodes=len(nodes) --ntasks-per-node=k`` with
    the default block distribution: tasks 0..k-1 on the first node, and so on."""
    ntasks = len(nodes) * tasks_per_node
    return [{"SLURM_JOB_ID": job_id, "SLURM_JOB_NODELIST": nodelist or ",".join(nodes),
             "SLURM_NNODES": str(len(nodes)), "SLURM_NTASKS": str(ntasks),
             "SLURM_NODEID": str(task // tasks_per_node), "SLURMD_NODENAME":
             nodes[task // tasks_per_node], "SLURM_PROCID": str(task),
             "SLURM_LOCALID": str(task % tasks_per_node)} for task in range(ntasks)]


def per_task_run(tasks: int = 2, timeout: float = 60.0) -> AgentsResult:
    """(b) on this machine: one "node" (``localhost``), ``tasks`` srun tasks, each a plain
    ``python -m ddp_lab.scripts.print_env`` with srun's variables plus the ones
    ``env_for_task`` derives. No launcher between them: the processes find each other
    through ``env://`` alone."""
    port = free_loopback_port()
    agents = [Agent(ThisMachine(f"task{task['SLURM_PROCID']}"), (),
                    {**task, **env_for_task(task, port)}, module="ddp_lab.scripts.print_env")
              for task in srun_env(["localhost"], tasks)]
    return run_agents(agents, timeout=timeout, echo=False)


def sbatch_torchrun(nodes: int = 2, gpus_per_node: int = 8, port: str = JOB_PORT,
                    per_task_expansion: bool = True) -> str:
    """(a) as an sbatch script: one srun task per node, each running torchrun. The command
    is in single quotes so that each task's bash expands ``$SLURM_NODEID`` on its own node;
    ``per_task_expansion=False`` writes the common unquoted form, where the batch script's
    shell expands it once, on the first node, for all of them."""
    command = [f"torchrun --nnodes=$SLURM_NNODES --node-rank=$SLURM_NODEID \\",
               f"    --nproc-per-node={gpus_per_node} --rdzv-backend=c10d \\",
               "    --rdzv-endpoint=$head:$port --rdzv-id=$SLURM_JOB_ID train.py"]
    if per_task_expansion:
        launch = ["export head port CUDA_DEVICE_ORDER=PCI_BUS_ID",
                  "# in '...' each node's own shell expands $SLURM_NODEID (this one would say 0)",
                  f"srun bash -c 'exec {command[0]}", *command[1:-1], f"{command[-1]}'"]
    else:
        launch = ["export CUDA_DEVICE_ORDER=PCI_BUS_ID", f"srun {command[0]}", *command[1:]]
    return "\n".join([
        "#!/bin/bash", f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={gpus_per_node}", "",
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        f"port={port}", *launch])


def sbatch_per_task(nodes: int = 2, gpus_per_node: int = 8, port: str = JOB_PORT) -> str:
    """(b) as an sbatch script: one srun task per GPU, each mapping SLURM's variables."""
    exports = " ".join(f"{name}=${source}" for name, source in PER_TASK_VARS.items())
    return "\n".join([
        "#!/bin/bash", f"#SBATCH --nodes={nodes}", f"#SBATCH --ntasks-per-node={gpus_per_node}",
        f"#SBATCH --gpus-per-node={gpus_per_node}", "",
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        f"export MASTER_PORT={port} CUDA_DEVICE_ORDER=PCI_BUS_ID",
        f"srun bash -c 'export {exports}; exec python train.py'"])


# What the stand-ins print, one line per started process: its command line, then the
# variables an env:// worker reads (empty under torchrun, which sets them for its workers).
_STAND_IN = ('#!/bin/sh\nprintf \'%s\\t\' "$SLURM_PROCID" "$(basename "$0") $*" '
             '"RANK=$RANK" "LOCAL_RANK=$LOCAL_RANK" "WORLD_SIZE=$WORLD_SIZE" '
             '"MASTER_ADDR=$MASTER_ADDR" "MASTER_PORT=$MASTER_PORT"; echo\n')


def sbatch_dry_run(script: str, nodes: list[str], tasks_per_node: int,
                   nodelist: str | None = None, job_id: str = "4242") -> list[dict]:
    """Run an sbatch script's text through bash as SLURM would, and return what each srun
    task started: ``{"task", "command", "env"}`` in task order. The script runs on the
    first node, in the environment of the job's task 0; ``scontrol show hostnames`` prints
    ``expand_hostlist``; ``srun CMD`` runs CMD once per task with that task's variables
    (``srun_env``, one after the other); ``torchrun`` and ``python`` print their command
    line instead of starting anything."""
    tasks = srun_env(nodes, tasks_per_node, job_id, nodelist)
    with tempfile.TemporaryDirectory(prefix="ddp_lab_sbatch_") as stand_ins:
        _write_stand_ins(stand_ins, tasks, expand_hostlist(tasks[0]["SLURM_JOB_NODELIST"]))
        env = {"PATH": f"{stand_ins}:{os.environ['PATH']}", **tasks[0]}
        done = subprocess.run(["bash", "-c", script], env=env, capture_output=True,
                              text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"the sbatch script failed under bash (exit code "
                           f"{done.returncode}): {done.stderr.strip()}")
    return [_started(line) for line in done.stdout.splitlines()]


def _write_stand_ins(folder: str, tasks: list[dict[str, str]], hosts: list[str]) -> None:
    srun = ["#!/bin/sh"] + [
        "env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in task.items()) + ' "$@" || exit $?'
        for task in tasks]
    scripts = {"scontrol": "#!/bin/sh\nprintf '%s\\n' " + " ".join(hosts) + "\n",
               "srun": "\n".join(srun) + "\n", "torchrun": _STAND_IN, "python": _STAND_IN}
    for name, text in scripts.items():
        path = os.path.join(folder, name)
        with open(path, "w") as out:
            out.write(text)
        os.chmod(path, 0o700)


def _started(line: str) -> dict:
    task, command, *variables = line.rstrip("\t").split("\t")
    env = dict(v.split("=", 1) for v in variables)
    return {"task": int(task), "command": command.split(),
            "env": {k: v for k, v in env.items() if v}}
