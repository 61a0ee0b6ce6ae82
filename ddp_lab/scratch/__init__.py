"""The from-scratch implementations the chapters build and check against torch's own: short,
readable, one concept per module, needing nothing but torch. ``from ddp_lab import scratch``."""

from ddp_lab.scratch.ddp import DDP  # write your own DDP: the capstone after notebook 07
from ddp_lab.scratch.fsdp import FSDP, full_state_dict
from ddp_lab.scratch.pipeline import PipelineStage
from ddp_lab.scratch.sharded_optimizer import ShardedOptimizer
from ddp_lab.scratch.ring import ring_all_reduce, ring_reduce_scatter
from ddp_lab.scratch.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from ddp_lab.scratch.ring_attention import ring_attention
from ddp_lab.scratch.ulysses import ulysses_attention
from ddp_lab.scratch.moe import MoE
