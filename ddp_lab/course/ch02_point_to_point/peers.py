"""Which send met which recv, and whether their buffers agree: what turns gloo's abort on a
mismatched pair into a sentence that names the two buffers.

A recv whose buffer is smaller than what arrives, or of another dtype with fewer bytes,
kills the receiving process: gloo throws ``gloo::EnforceNotMet`` ("Received data size
doesn't match expected size", third_party/gloo/gloo/transport/tcp/pair.cc) on its own
thread, C++ calls ``std::terminate``, and Python prints only "Fatal Python error: Aborted".
A bigger buffer is filled silently in part. So :class:`AnnouncedP2P` (a
:class:`CollectiveTrace`, it sees every send and recv however it is reached) prints each
buffer on the rank's stderr *before* the op runs; whatever happens next, every rank's
output still holds the announcements, and :func:`mismatch` pairs the k-th send from a to
b with the k-th recv on b from a (gloo delivers one pair's messages in order).
"""

from __future__ import annotations

import re
import sys

import torch

from ddp_lab.course.collective_trace import FAMILY_OF, NAMESPACES, CollectiveTrace

MARK = "[ddp-lab p2p]"
_LINE = re.compile(re.escape(MARK) + r" (send|recv) (-?\d+|None) \(([\d, ]*)\) torch\.(\w+)$")


class AnnouncedP2P(CollectiveTrace):
    """A CollectiveTrace that also prints every send's and recv's peer, shape and dtype
    before the op runs, and keeps them in ``announced`` (kind, peer, shape, dtype name)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.announced: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind = FAMILY_OF.get(func.__name__.split(".")[0])
        if getattr(func, "namespace", "") in NAMESPACES and kind in ("send", "recv"):
            tensor = args[0][0]
            record = (kind, self._peer(func, args), tuple(tensor.shape),
                      str(tensor.dtype).removeprefix("torch."))
            self.announced.append(record)
            print(f"{MARK} {record[0]} {record[1]} {record[2]} torch.{record[3]}",
                  file=sys.stderr, flush=True)
        return super().__torch_dispatch__(func, types, args, kwargs)


def announced_in(logs: list[str]) -> list[list[tuple]]:
    """Every rank's announcements, read back from its output."""
    found = []
    for log in logs:
        records = []
        for line in (log or "").splitlines():
            match = _LINE.search(line.strip())
            if match:
                kind, peer, shape, dtype = match.groups()
                dims = tuple(int(d) for d in shape.replace(" ", "").split(",") if d)
                records.append((kind, None if peer == "None" else int(peer), dims, dtype))
        found.append(records)
    return found


def _numel(shape: tuple) -> int:
    return int(torch.Size(shape).numel())


def _buffer(shape: tuple, dtype: str) -> str:
    return f"shape {shape} of {dtype} ({_numel(shape)} elements)"


def mismatch(records: list[list[tuple]], counts: bool = False) -> str | None:
    """The first send/recv pair whose buffers differ in element count or dtype, in words;
    with ``counts``, also a pair of ranks whose sends and recvs do not match in number
    (what leaves a rank waiting). None if every pair agrees."""
    for src, sent in enumerate(records):
        for dst in range(len(records)):
            sends = [r for r in sent if r[0] == "send" and r[1] == dst]
            recvs = [r for r in records[dst] if r[0] == "recv" and r[1] == src]
            for k, (send, recv) in enumerate(zip(sends, recvs)):
                if _numel(send[2]) != _numel(recv[2]) or send[3] != recv[3]:
                    return (f"rank {src}'s send #{k + 1} to rank {dst} carries a tensor of "
                            f"{_buffer(send[2], send[3])}, but the recv on rank {dst} that "
                            f"meets it (its #{k + 1} from rank {src}) has a buffer of "
                            f"{_buffer(recv[2], recv[3])}. A send and its recv must agree in "
                            "size and dtype (a smaller buffer aborts the receiving process, "
                            "a bigger one is filled in part): allocate receive buffers like "
                            "the tensor that is sent (torch.empty_like).")
            if counts and len(sends) != len(recvs) and not _any_source(records[dst]):
                return (f"when it stopped, rank {src} had posted {len(sends)} send(s) to "
                        f"rank {dst}, and rank {dst} {len(recvs)} recv(s) from rank {src}: a "
                        "send needs its recv posted on the other side (and the other way "
                        "round) before either can finish.")
    return None


def _any_source(records: list[tuple]) -> bool:
    return any(r[0] == "recv" and r[1] is None for r in records)


def to_itself(records: list[list[tuple]]) -> str | None:
    """A rank that named itself, or a rank that does not exist, as the peer of a send or
    recv, in words."""
    for rank, mine in enumerate(records):
        for kind, peer, _, _ in mine:
            if peer == rank:
                return (f"rank {rank} posted a {kind} with itself as the peer: a rank does not "
                        "send to itself (gloo has no connection to itself: 'Pair is not "
                        "connected'); when a tensor would go back home, keep a copy instead.")
            if peer is not None and not 0 <= peer < len(records):
                return (f"rank {rank} posted a {kind} with rank {peer} as the peer, and the "
                        f"ranks are 0 to {len(records) - 1}: wrap around with % world_size.")
    return None


def explain(err) -> str | None:
    """For run_ranks(explain=...): a send or recv to itself, a mismatched pair found in the
    ranks' output (with gloo's own words when it aborted) or, after a hang, a pair of ranks
    whose sends and recvs do not match in number."""
    import ddp_lab
    logs = list(getattr(err, "logs", None) or [])
    records = announced_in(logs)
    said = to_itself(records) or mismatch(records,
                                          counts=isinstance(err, ddp_lab.WorkerTimeout))
    gloo = next((line.strip() for log in logs for line in (log or "").splitlines()
                 if "doesn't match expected size" in line), None)
    if said and gloo:
        return f"{said} (gloo said: {gloo})"
    return said
