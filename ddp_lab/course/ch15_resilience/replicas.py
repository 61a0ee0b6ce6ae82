"""A replica group that loses a member and goes on (notebook 15), built from
``torch.distributed`` the way torchft does it (https://github.com/pytorch/torchft: its
``Manager`` asks a lighthouse for a quorum every step, reconfigures a process group with the
members, all-reduces the gradients among them only, and lets a replica that is behind heal
by receiving the state of a peer that is up to date).

Here every replica is one rank of a ``ddp_lab.run``; rank 0 also plays the lighthouse. The
quorum goes through the run's TCPStore: at every step each live replica writes
``step{k}/{replica}`` (its own step count); the lighthouse waits for the members of the last
quorum at most ``heartbeat_s`` each, adds any replica that announced itself, and publishes
the quorum (members, and for a replica behind, the peer it heals from). Each new quorum gets
its own gloo process group, made directly on a ``PrefixStore`` of the same store
(``ProcessGroupGloo(store, rank, size, timeout)``), as torchft's ``ProcessGroupGloo``
reconfigures itself; the default group is not used after set-up, so a replica that leaves
blocks nobody.

The demo's failure is deterministic: replica ``lost`` leaves before step ``lose_at`` (its
function returns, so its process ends); replica ``spare`` is a fresh process that announces
itself at start and joins at step ``rejoin_at`` with differently initialized weights and no
progress, and heals from a peer. torchft also survives a member that dies inside an
all-reduce (the error is caught and the step is not committed); that case is not run here.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddp_lab.course.ch15_resilience.workload import regression_data
from ddp_lab.course.models import MLPConfig, make_mlp

LIGHTHOUSE = 0


@dataclass(frozen=True)
class FailureConfig:
    """Four ranks: replicas 0-2 start; ``lost`` leaves before ``lose_at``; ``spare`` joins
    at ``rejoin_at``."""

    model: MLPConfig = MLPConfig(inputs=16, width=32, depth=3, outputs=4)
    steps: int = 12
    lose_at: int = 4
    rejoin_at: int = 8
    lost: int = 2
    spare: int = 3
    heartbeat_s: float = 2.0  # generous: a live replica late by that much on a busy machine is dropped
    batch: int = 8
    lr: float = 0.1


class Lighthouse:
    """Rank 0's second role: decide each step's quorum from what the replicas wrote."""

    def __init__(self, store, config: FailureConfig):
        self.store, self.config = store, config
        self.members = [r for r in range(dist.get_world_size()) if r != config.spare]
        self.waited: dict[int, float] = {}

    def decide(self, step: int) -> dict:
        """Members: those of the last quorum that wrote their step within the heartbeat,
        plus any replica that announced it joins at this step. Healing: each member behind
        the furthest step gets a source, the lowest-ranked member at that step."""
        present = [r for r in self.members if self._arrived(step, r)]
        joining = [r for r in self._announced(step) if r not in present]
        for r in joining:
            self.store.wait([f"step{step}/{r}"])
        members = sorted(present + joining)
        steps = {r: int(self.store.get(f"step{step}/{r}")) for r in members}
        furthest = max(steps.values())
        source = min(r for r in members if steps[r] == furthest)
        quorum = {"id": step, "members": members, "step": furthest,
                  "heal": {str(r): source for r in members if steps[r] < furthest}}
        self.members = members
        self.store.set(f"quorum{step}", json.dumps(quorum))
        return quorum

    def _arrived(self, step: int, replica: int) -> bool:
        start = time.perf_counter()
        try:
            self.store.wait([f"step{step}/{replica}"], timedelta(seconds=self.config.heartbeat_s))
            return True
        except Exception:  # the store's timeout: the replica did not show up
            self.waited[step] = time.perf_counter() - start
            return False

    def _announced(self, step: int) -> list[int]:
        return [r for r in range(dist.get_world_size())
                if self.store.check([f"joins/{r}"]) and int(self.store.get(f"joins/{r}")) == step]


class Replica:
    """One replica's model, optimizer, step count and current process group."""

    def __init__(self, store, config: FailureConfig, seed: int):
        self.store, self.config = store, config
        self.model = make_mlp(config.model, seed=seed)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=config.lr, momentum=0.9)
        self.step, self.group, self.quorum_members = 0, None, None

    def join(self, k: int) -> dict:
        """Write this replica's step for quorum ``k``, wait for the lighthouse's decision,
        and make a new process group if the members changed."""
        self.store.set(f"step{k}/{dist.get_rank()}", str(self.step))
        quorum = json.loads(self.store.get(f"quorum{k}"))
        if quorum["members"] != self.quorum_members:
            self.quorum_members = quorum["members"]
            index = quorum["members"].index(dist.get_rank())
            prefixed = dist.PrefixStore(f"group{k}/", self.store)
            self.group = dist.ProcessGroupGloo(prefixed, index, len(quorum["members"]),
                                               timedelta(seconds=30))
        return quorum

    def heal(self, quorum: dict) -> None:
        """Every member takes part; the source's parameters, momenta and step reach all."""
        options = dist.BroadcastOptions()
        options.rootRank = quorum["members"].index(next(iter(quorum["heal"].values())))
        for tensor in self._state():
            self.group.broadcast([tensor], options).wait()
        self.step = quorum["step"]

    def _state(self) -> list[torch.Tensor]:
        params = [p.data for p in self.model.parameters()]
        for p in self.model.parameters():  # momenta exist after the first step
            self.optimizer.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
        return params + [self.optimizer.state[p]["momentum_buffer"]
                         for p in self.model.parameters()]

    def train_step(self, x, y, size: int) -> float:
        """Gradients averaged over the quorum's members only (one all-reduce of them all)."""
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(x), y)
        loss.backward()
        grads = [p.grad for p in self.model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.group.allreduce([flat]).wait()
        flat /= size
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        self.optimizer.step()
        self.step += 1
        return loss.item()

    def checksum(self) -> list[float]:
        return torch.cat([p.detach().reshape(-1) for p in self.model.parameters()]).tolist()


def _batch(data, step: int, replica: int, batch: int):
    """Replica ``replica``'s rows of step ``step`` (4 slots per step, one per replica)."""
    x, y = data
    start = (step * 4 + replica) * batch
    return x[start:start + batch], y[start:start + batch]


def run_replica(config: FailureConfig = FailureConfig()) -> dict:
    """On each of 4 ranks: one replica (rank 0 also the lighthouse). Returns what this
    replica saw: per quorum its members, healing and loss, and its final parameters."""
    rank, store = dist.get_rank(), dist.distributed_c10d._get_default_store()
    data = regression_data(config.model, (config.steps + 1) * 4 * config.batch)
    replica = Replica(store, config, seed=0 if rank != config.spare else 1)
    lighthouse = Lighthouse(store, config) if rank == LIGHTHOUSE else None
    first = 0
    if rank == config.spare:
        store.set(f"joins/{rank}", str(config.rejoin_at))
        first = config.rejoin_at
    seen, before_heal = [], None
    for k in range(first, config.steps):
        if rank == config.lost and k == config.lose_at:
            return {"rank": rank, "left_at": k, "seen": seen}
        if lighthouse is not None:
            replica.store.set(f"step{k}/{rank}", str(replica.step))
            lighthouse.decide(k)
        quorum = replica.join(k)
        if quorum["heal"]:
            before_heal = before_heal or replica.checksum()
            replica.heal(quorum)
        loss = replica.train_step(*_batch(data, replica.step, rank, config.batch),
                                  len(quorum["members"]))
        seen.append({"step": k, "members": quorum["members"], "heal": quorum["heal"],
                     "loss": loss, "replica_step": replica.step})
    return {"rank": rank, "seen": seen, "params": replica.checksum(),
            "before_heal": before_heal,
            "waited_s": lighthouse.waited if lighthouse else None}


def one_process(seen: list[dict], config: FailureConfig = FailureConfig()) -> list[float]:
    """What one process computes from the same batches when each step's gradient is the
    mean over that step's quorum members: the final parameters the surviving replicas must
    hold (the run changed who contributed, not what a step is)."""
    data = regression_data(config.model, (config.steps + 1) * 4 * config.batch)
    model = make_mlp(config.model, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=0.9)
    for step, record in enumerate(seen):
        optimizer.zero_grad()
        members = record["members"]
        for replica in members:
            x, y = _batch(data, step, replica, config.batch)
            (F.mse_loss(model(x), y) / len(members)).backward()
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def largest_difference(a: list[float], b: list[float]) -> float:
    return (torch.tensor(a) - torch.tensor(b)).abs().max().item()
