"""What the learner's code sent, counted on each rank: bytes and messages through
``send``/``isend``/``recv``/``irecv`` and ``batch_isend_irecv``, and from them how many
rounds an algorithm took.

Why wrap ``isend``/``irecv`` only: in torch's ``distributed_c10d`` the blocking ``send`` and
``recv`` call the module's own ``isend``/``irecv`` and wait, and ``batch_isend_irecv`` calls
the ``op`` of each ``P2POp`` (``dist.isend`` or ``dist.irecv``, checked by identity against
the module's names), so one stand-in per name, set on both ``torch.distributed`` and
``distributed_c10d``, sees every point-to-point message exactly once.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

import torch.distributed as dist
from torch.distributed import distributed_c10d

from ddp_lab.exercises.builtins_off import replaced


@dataclass(frozen=True)
class Message:
    """One point-to-point call on this rank, in call order: ``kind`` is "send" or "recv",
    ``peer`` the other side's global rank (None: from any source)."""

    kind: str
    peer: int | None
    nbytes: int


@dataclass
class P2PLog:
    """Every point-to-point call of one rank while recording."""

    messages: list[Message] = field(default_factory=list)

    @property
    def bytes_sent(self) -> int:
        return sum(m.nbytes for m in self.messages if m.kind == "send")

    @property
    def sends(self) -> int:
        return sum(m.kind == "send" for m in self.messages)


@contextlib.contextmanager
def recording_p2p() -> Iterator[P2PLog]:
    """Inside the block every isend/irecv (and so send/recv/batch_isend_irecv) of this rank
    is logged, then done as usual."""
    log = P2PLog()
    isend = _logged(distributed_c10d.isend, "send", "dst", "group_dst", log)
    irecv = _logged(distributed_c10d.irecv, "recv", "src", "group_src", log)
    with contextlib.ExitStack() as stack:
        for module in (dist, distributed_c10d):
            stack.enter_context(replaced(module, "isend", isend))
            stack.enter_context(replaced(module, "irecv", irecv))
        yield log


def _logged(original, kind: str, peer_name: str, group_peer_name: str, log: P2PLog):
    def call(tensor, *args, **kwargs):
        log.messages.append(Message(kind, _global_peer(args, kwargs, peer_name,
                                                       group_peer_name),
                                    tensor.numel() * tensor.element_size()))
        return original(tensor, *args, **kwargs)
    call.__name__ = original.__name__
    return call


def _global_peer(args, kwargs, peer_name: str, group_peer_name: str) -> int | None:
    peer = args[0] if args else kwargs.get(peer_name)
    group = args[1] if len(args) > 1 else kwargs.get("group")
    group_peer = args[3] if len(args) > 3 else kwargs.get(group_peer_name)
    if peer is None and group_peer is not None:
        return dist.get_global_rank(group or dist.group.WORLD, group_peer)
    return peer


def rounds(logs: list[list[Message]]) -> int:
    """How many rounds the ranks' messages took, if a rank sends one message per round and
    can forward only what it has received: a send's round is one more than the sender's
    clock, a receive moves the receiver's clock up to the matching send's round.

    A binomial tree broadcast on n ranks takes ceil(log2 n) rounds; the root sending to
    everyone, or a chain, takes n - 1. The logs come from every rank, in call order."""
    sent_round: dict[tuple[int, int, int], int] = {}  # (src, dst, k-th on that pair) -> round
    pending = {rank: list(log) for rank, log in enumerate(logs)}
    clock = {rank: 0 for rank in pending}
    counts: dict[tuple[int, int, str], int] = {}
    progress = True
    while progress and any(pending.values()):
        progress = False
        for rank, todo in pending.items():
            while todo and _step(rank, todo[0], clock, sent_round, counts):
                todo.pop(0)
                progress = True
    return max(clock.values(), default=0)


def _step(rank: int, message: Message, clock, sent_round, counts) -> bool:
    """Apply one message to the clocks; False while its matching send is not known yet."""
    if message.peer is None:
        raise ValueError("a recv from any source cannot be matched: name the source rank")
    pair = (rank, message.peer, message.kind)
    k = counts.get(pair, 0)
    if message.kind == "send":
        clock[rank] += 1
        sent_round[(rank, message.peer, k)] = clock[rank]
    else:
        key = (message.peer, rank, k)
        if key not in sent_round:
            return False
        clock[rank] = max(clock[rank], sent_round[key])
    counts[pair] = k + 1
    return True
