"""What the learner's code sent, counted on each rank: bytes and messages of every
point-to-point call, and from them how many rounds an algorithm took.

Recorded by :class:`~ddp_lab.course.collective_trace.CollectiveTrace`, at the dispatcher:
``dist.send``/``isend``/``recv``/``irecv``, the same names imported, ``batch_isend_irecv``
and the process group's own ``send``/``recv`` methods all reach the ``c10d::send`` and
``c10d::recv_`` ops (torch/csrc/distributed/c10d/ProcessGroup.hpp), so each message is seen
exactly once whichever way the learner wrote it. The same mode refuses the collectives an
exercise switches off (``forbid``), before they run.

A send and a recv whose buffers differ in size or dtype can abort gloo's process with no
word of why ("Fatal Python error: Aborted"). So with ``journal=`` a folder, each rank also
writes every send and recv to it BEFORE the op runs, and :func:`naming_mismatches` turns a
failed check into one that names the mismatched pair.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_leaves

from ddp_lab.course.collective_trace import FAMILY_OF, CollectiveTrace
from ddp_lab.exercises.registry import ExerciseFailed
from ddp_lab.exercises.sealed import instrument


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
def recording_p2p(forbid=(), why: str = "", journal: str | None = None) -> Iterator[P2PLog]:
    """Inside the block every send and recv of this rank is logged, then done as usual;
    the collective families in ``forbid`` refuse with ``why``; with ``journal`` (a folder)
    each send and recv is also written there before it runs."""
    trace = _Journaled(journal, forbid=forbid, why=why) if journal else CollectiveTrace(
        forbid=forbid, why=why)
    with trace:
        yield P2PLog(trace)


class _Journaled(CollectiveTrace):
    """A CollectiveTrace that writes each send and recv to ``folder/rank<r>.jsonl`` before
    running it, so the record survives a process that gloo aborts."""

    def __init__(self, folder: str, **kwargs):
        super().__init__(**kwargs)
        self.path = Path(folder) / f"rank{dist.get_rank()}.jsonl"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind = FAMILY_OF.get(func.__name__.split(".")[0])
        if getattr(func, "namespace", "") == "c10d" and kind in ("send", "recv"):
            tensor = next(t for t in tree_leaves(args) if isinstance(t, torch.Tensor))
            entry = {"kind": kind, "peer": self._peer(func, args), "numel": tensor.numel(),
                     "dtype": str(tensor.dtype).replace("torch.", "")}
            self._write(entry)
        return super().__torch_dispatch__(func, types, args, kwargs)

    @instrument  # the learner's function has files closed; the checker's journal does not
    def _write(self, entry: dict) -> None:
        with open(self.path, "a") as journal:
            journal.write(json.dumps(entry) + "\n")


@contextlib.contextmanager
def naming_mismatches() -> Iterator[str]:
    """A journal folder for one run; an ExerciseFailed raised in the block gets, first, the
    send/recv pairs whose sizes or dtypes differ, if the journals show any."""
    folder = tempfile.mkdtemp(prefix="ddp_lab_p2p_")
    try:
        yield folder
    except ExerciseFailed as failure:
        said = mismatches(folder)
        if not said:
            raise
        raise ExerciseFailed(f"{said}\n\n{failure}") from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def mismatches(folder: str) -> str:
    """Each rank's k-th send to a peer against that peer's k-th recv from it: the pairs
    whose element counts or dtypes differ, in words ("" if none)."""
    journals = {int(path.stem[4:]): [json.loads(line) for line in path.read_text().splitlines()]
                for path in Path(folder).glob("rank*.jsonl")}
    found = []
    for src, entries in sorted(journals.items()):
        for dst in sorted({e["peer"] for e in entries if e["kind"] == "send"}):
            sends = [e for e in entries if e["kind"] == "send" and e["peer"] == dst]
            recvs = [e for e in journals.get(dst, []) if e["kind"] == "recv" and e["peer"] == src]
            for k, (sent, into) in enumerate(zip(sends, recvs)):
                if (sent["numel"], sent["dtype"]) != (into["numel"], into["dtype"]):
                    found.append(f"rank {src}'s send #{k + 1} to rank {dst} is {sent['numel']} "
                                 f"{sent['dtype']} elements, and rank {dst}'s recv #{k + 1} from "
                                 f"rank {src} has a buffer of {into['numel']} {into['dtype']}")
    if not found:
        return ""
    return ("A send and its recv do not match: " + "; ".join(found[:3]) + ". A recv's buffer "
            "must have the size and dtype of what is sent to it (gloo aborts, or reads the "
            "bytes as another dtype, without saying why).")


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
