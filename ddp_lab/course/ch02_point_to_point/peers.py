"""Why a point-to-point exercise crashed or hung, read from the journal that
:func:`ddp_lab.exercises.bytes_sent.recording_p2p` keeps (each rank writes every send and
recv there before it runs, so the record survives a process that gloo aborts).

The size and dtype of a send against its recv are ``bytes_sent.naming_mismatches``' part;
this adds what it leaves out: a rank that names itself as the peer (gloo has no connection
to itself: "Pair is not connected"), a peer that does not exist (gloo aborts the process
without a word), and, after a hang, two ranks whose sends and recvs do not match in number.
"""

from __future__ import annotations

import json
from pathlib import Path


def journals(folder: str) -> dict[int, list[dict]]:
    """Every rank's entries ({"kind", "peer", "numel", "dtype"}), in call order."""
    return {int(path.stem[4:]): [json.loads(line) for line in path.read_text().splitlines()]
            for path in Path(folder).glob("rank*.jsonl")}


def bad_peer(entries: dict[int, list[dict]], world_size: int) -> str | None:
    """A send or recv addressed to the rank itself or to a rank that does not exist."""
    for rank, mine in sorted(entries.items()):
        for entry in mine:
            kind, peer = entry["kind"], entry["peer"]
            if peer == rank:
                return (f"rank {rank} posted a {kind} with itself as the peer: a rank does not "
                        "send to itself (gloo has no connection to itself: 'Pair is not "
                        "connected'); when a tensor would go back home, keep a copy instead.")
            if peer is not None and not 0 <= peer < world_size:
                return (f"rank {rank} posted a {kind} with rank {peer} as the peer, and the "
                        f"ranks are 0 to {world_size - 1}: wrap around with % world_size.")
    return None


def unmatched(entries: dict[int, list[dict]]) -> str | None:
    """Two ranks whose sends and recvs to each other do not match in number (when a run
    hangs: what each side had posted when it stopped)."""
    if any(e["kind"] == "recv" and e["peer"] is None for mine in entries.values() for e in mine):
        return None  # a recv from any source matches any send: no pairing to check
    for src, mine in sorted(entries.items()):
        for dst in sorted(entries):
            sends = sum(e["kind"] == "send" and e["peer"] == dst for e in mine)
            recvs = sum(e["kind"] == "recv" and e["peer"] == src for e in entries[dst])
            if sends != recvs:
                return (f"when it stopped, rank {src} had posted {sends} send(s) to rank "
                        f"{dst}, and rank {dst} {recvs} recv(s) from rank {src}: a send needs "
                        "its recv posted on the other side (and the other way round) before "
                        "either can finish.")
    return None


def peer_problem(folder: str, world_size: int, err) -> str | None:
    """For run_ranks(explain=...): what the journals say went wrong, in words."""
    import ddp_lab
    entries = journals(folder)
    said = bad_peer(entries, world_size)
    if said is None and isinstance(err, ddp_lab.WorkerTimeout):
        said = unmatched(entries)
    return said
