"""Notebook 08, part 5: a worker dies, torchrun restarts the job, training resumes.

``torchrun --max-restarts=N`` restarts the *whole* worker group when any worker fails (up to
N times); it cannot save your progress, so the script must: a checkpoint every epoch, and
"resume if a checkpoint exists" at start-up. ``train_cnn`` does both, deterministically, so a
killed-and-resumed run must end with exactly the weights of an uninterrupted one.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ddp_lab.course.ports import lost_port_race, say_lost_port_race
from ddp_lab.launch.torchrun.command import TorchrunResult, torchrun

TRAIN_ARGS = ("--epochs", "3", "--batch-size", "32", "--no-progress")
# torch 2.13: with the rendezvous store shared between torchrun's agent and the workers (the
# default), restarted workers can read the previous attempt's addresses and fail in
# connectFullMesh or hang; a fresh store per attempt avoids it (pytorch/pytorch#135712).
RESTART_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
_EPOCH_DONE = re.compile(r"Epoch \[(\d+)/\d+\] completed\. Loss: ([0-9.]+)")
_ATTEMPT = re.compile(r"restart_count=(\d+)")


def killed_once_under_torchrun(checkpoint: str | Path, max_restarts: int = 1,
                               timeout: float = 180.0, tries: int = 3) -> TorchrunResult:
    """``train_cnn`` under ``torchrun --max-restarts``, with rank 1 SIGKILLed once right
    after the first checkpoint (``scripts/train_cnn_killed_once.py``).

    With the rendezvous store not shared (``RESTART_ENV``), torchrun's agent picks the
    workers' port by binding and closing a socket, and rank 0 binds it seconds later, once
    torch is imported: on a busy machine another program can take it in between, and that
    attempt dies of it, not of the kill. Such a run is thrown away and started again."""
    from ddp_lab.launch.config import threads_per_rank
    env = {**RESTART_ENV, "LOGLEVEL": "INFO",  # torchrun's agent then reports restarts
           # the same threads per rank as ddp_lab's reference run: bit-identical arithmetic
           "OMP_NUM_THREADS": str(threads_per_rank(2))}
    for attempt in range(1, tries + 1):
        result = torchrun(["-m", "ddp_lab.scripts.train_cnn_killed_once", *TRAIN_ARGS,
                           "--checkpoint", str(checkpoint)], 2,
                          options=(f"--max-restarts={max_restarts}", "--monitor-interval=0.1"),
                          env=env, timeout=timeout)
        if attempt == tries or not lost_port_race(result.output):
            return result
        say_lost_port_race("running the demo again")
        Path(checkpoint).unlink(missing_ok=True)  # written by this run: the script wants none


def uninterrupted(checkpoint: str | Path, **run_kwargs):
    """The same training, never interrupted, on ddp_lab's ranks (values: train's dicts)."""
    import ddp_lab
    from ddp_lab.scripts import script_path
    return ddp_lab.run_script(script_path("train_cnn.py"), 2,
                              script_args=[*TRAIN_ARGS, "--checkpoint", str(checkpoint)],
                              **{"timeout": 120.0, **run_kwargs})


def final_weights(checkpoint: str | Path) -> torch.Tensor:
    """The model in a checkpoint, flattened in ``model.parameters()`` order (the layout of
    train's ``final_weights``)."""
    from ddp_lab.course.params import flat_params
    from ddp_lab.course.models import DigitsCNN
    model = DigitsCNN()
    model.load_state_dict(torch.load(checkpoint, weights_only=True)["model"])
    return flat_params(model)


def epoch_losses_by_attempt(output: str) -> dict[int, dict[int, float]]:
    """``{restart_count: {epoch: loss}}`` from torchrun's log: which attempt ran which epoch."""
    attempts: dict[int, dict[int, float]] = {}
    attempt = 0
    for line in output.splitlines():
        if match := _ATTEMPT.search(line):
            attempt = int(match.group(1))
        elif match := _EPOCH_DONE.search(line):
            attempts.setdefault(attempt, {})[int(match.group(1))] = float(match.group(2))
    return attempts


def story(result: TorchrunResult) -> str:
    """The lines of torchrun's output that tell what happened, in order."""
    keep = ("restart_count=", "completed. Loss", "SIGKILL", "Connection", "Error: ",
            "failed (exitcode", "Worker group FAILED", "Resumed from", "Test accuracy",
            "successfully finished")
    lines = []
    for line in result.lines(*keep):
        lines.append(re.sub(r"^[IWE]\d{4} [\d:.]+ \d+ \S+\] ", "", line).strip()[:150])
    return "\n".join(lines)
