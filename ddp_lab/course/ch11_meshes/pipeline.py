"""Pipeline parallel in miniature (notebook 11): the same small model cut into one stage
per rank, trained one step with GPipe and with 1F1B (``scratch.PipelineStage``), each
rank's timeline recorded, the gradients compared with one process on the whole batch, and
the bubble measured against (p-1)/(m+p-1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from ddp_lab import scratch


@dataclass(frozen=True)
class PipeConfig:
    width: int = 256
    layers_per_stage: int = 3
    microbatches: int = 4
    microbatch_rows: int = 128
    seed: int = 0


def make_stages(config: PipeConfig, stages: int) -> list[nn.Sequential]:
    torch.manual_seed(config.seed)
    return [nn.Sequential(*[m for _ in range(config.layers_per_stage)
                            for m in (nn.Linear(config.width, config.width), nn.Tanh())])
            for _ in range(stages)]


def batch(config: PipeConfig) -> tuple[list, list]:
    g = torch.Generator().manual_seed(1)
    rows = config.microbatches * config.microbatch_rows
    x, y = torch.randn(rows, config.width, generator=g), torch.randn(rows, config.width, generator=g)
    return list(x.chunk(config.microbatches)), list(y.chunk(config.microbatches))


def reference(config: PipeConfig, stages: int) -> dict:
    """One process, all stages in a row, the mean loss over micro-batches."""
    model = nn.Sequential(*make_stages(config, stages))
    xs, ys = batch(config)
    loss = sum(nn.functional.mse_loss(model(x), y) for x, y in zip(xs, ys)) / len(xs)
    loss.backward()
    return {"loss": loss.item(), "grads": [[p.grad for p in stage.parameters()] for stage in model]}


def pipeline_step(config: PipeConfig = PipeConfig(), schedules=("GPipe", "1F1B")) -> dict:
    """On each rank (= stage): per schedule, its timeline, its gradients and the loss."""
    rank = dist.get_rank()
    xs, ys = batch(config)
    results = {}
    for schedule in schedules:
        module = make_stages(config, dist.get_world_size())[rank]
        stage = scratch.PipelineStage(module, (config.microbatch_rows, config.width))
        stage.run(schedule, xs, ys, nn.functional.mse_loss)  # warm-up: first-call costs
        module.zero_grad()
        dist.barrier()
        out = stage.run(schedule, xs, ys, nn.functional.mse_loss)
        results[schedule] = {**out, "grads": [p.grad for p in module.parameters()]}
    return results


def bubble(timelines: list[list]) -> float:
    """The idle share of all stages' time between the first start and the last end."""
    start = min(s for spans in timelines for _, s, _ in spans)
    end = max(e for spans in timelines for _, _, e in spans)
    busy = sum(e - s for spans in timelines for _, s, e in spans)
    return 1 - busy / (len(timelines) * (end - start))


def expected_bubble(stages: int, microbatches: int) -> float:
    return (stages - 1) / (microbatches + stages - 1)
