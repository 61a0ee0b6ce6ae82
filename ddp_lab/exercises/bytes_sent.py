"""What the learner's code sent, counted on each rank: bytes and messages of every
point-to-point call, and from them how many rounds an algorithm took.

Recorded by :class:`~ddp_lab.course.collective_trace.CollectiveTrace`, at the dispatcher:
``dist.send``/``isend``/``recv``/``irecv``, the same names imported, ``batch_isend_irecv``
and the process group's own ``send``/``recv`` methods all reach the ``c10d::send`` and
``c10d::recv_`` ops (torch/csrc/distributed/c10d/ProcessGroup.hpp), so each message is seen
exactly once whichever way the learner wrote it. The same mode refuses the collectives an
exercise switches off (``forbid``), before they run.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch

from ddp_lab.course.collective_trace import CollectiveTrace


@dataclass(frozen=True)
class Message:
    """One point-to-point call on this rank, in call order: ``kind`` is "send" or "recv",
    ``peer`` the other side's global rank (None: from any source), ``nbytes`` the bytes of
    the tensor as sent, ``dtype`` its dtype."""

    kind: str
    peer: int | None
    nbytes: int
    dtype: torch.dtype | None = None

    @property
    def numel(self) -> int:
        size = torch.empty((), dtype=self.dtype).element_size() if self.dtype else 1
        return self.nbytes // size


class P2PLog:
    """Every point-to-point call of one rank while recording (read it inside or after the
    block; :attr:`messages` is plain data, to return from a rank)."""

    def __init__(self, trace: CollectiveTrace):
        self.trace = trace

    @property
    def messages(self) -> list[Message]:
        return [Message(call.family, call.peer, call.nbytes, call.dtype)
                for call in self.trace.of("send", "recv")]

    @property
    def bytes_sent(self) -> int:
        return sum(m.nbytes for m in self.messages if m.kind == "send")

    @property
    def sends(self) -> int:
        return sum(m.kind == "send" for m in self.messages)


@contextlib.contextmanager
def recording_p2p(forbid=(), why: str = "") -> Iterator[P2PLog]:
    """Inside the block every send and recv of this rank is logged, then done as usual;
    the collective families in ``forbid`` refuse with ``why``."""
    with CollectiveTrace(forbid=forbid, why=why) as trace:
        yield P2PLog(trace)


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
