"""Notebook 08b, part 2: the Flight Recorder, with gloo.

The Flight Recorder keeps, in every process, a ring buffer of the last collectives each
process group issued: op, sizes, dtypes, sequence numbers, state and the Python stack
(https://docs.pytorch.org/tutorials/prototype/flight_recorder_tutorial.html). Its size is
``TORCH_FR_BUFFER_SIZE`` (older name ``TORCH_NCCL_TRACE_BUFFER_SIZE``), 2000 entries by
default in torch 2.13 (``FlightRecorder.hpp``), so it is on unless set to 0. With NCCL its
watchdog dumps it on a timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT``); with gloo nothing dumps it
automatically, but ``torch._C._distributed_c10d._dump_fr_trace()`` returns the same pickle
on demand, and ProcessGroupGloo does record into it (its ``AsyncWork`` carries a
``trace_id_``). What a gloo dump lacks, in torch 2.13: the start and completion times, and
the ``pg_config`` table that ProcessGroupNCCL fills when it creates a communicator (gloo's
has one row with an empty name). The
analyzer (``torchfrtrace``, ``torch/distributed/flight_recorder/fr_trace.py``) needs that
table, so ``dump`` adds it from what every rank knows about its group.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

PREFIX = "fr_trace_"


def dump(folder: str, group=None) -> dict:
    """This rank's Flight Recorder buffer, with the group table the analyzer needs, written
    to ``folder/fr_trace_<rank>`` (the ``<prefix><rank>`` names the analyzer expects).

    The table gets a row for EVERY process group this rank belongs to (the default group,
    DDP's, any ``new_group``), not only ``group``: the buffer is shared by all of them, and
    the analyzer fails with a ``KeyError`` on an entry whose group has no row. ``group``
    (default: WORLD) must be one of them."""
    trace = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
    group = group or dist.group.WORLD
    groups = list(dist.distributed_c10d._world.pg_map)
    if group not in groups:
        raise ValueError(f"dump: this rank ({dist.get_rank()}) is not in group "
                         f"{group.group_name!r}; pass a group it belongs to, or none")
    config = {name: row for name, row in (trace["pg_config"] or {}).items() if name}
    for pg in groups:
        if not config.get(pg.group_name):
            config[pg.group_name] = {"name": pg.group_name, "desc": pg.group_desc,
                                     "ranks": json.dumps(dist.get_process_group_ranks(pg))}
    trace["pg_config"] = config
    with open(os.path.join(folder, f"{PREFIX}{dist.get_rank()}"), "wb") as f:
        pickle.dump(trace, f)
    return trace


def skip_one_collective(folder: str, missing_rank: int = 1, timeout_s: float = 2.0) -> dict:
    """Three all-reduces that every rank makes, then a fourth that ``missing_rank`` never
    makes (it is "busy elsewhere" past the group's timeout). Every rank then dumps its
    buffer. Returns this rank's error (if any) and its entries."""
    group = dist.new_group(timeout=timedelta(seconds=timeout_s), group_desc="training")
    t = torch.ones(1000)
    for _ in range(3):
        dist.all_reduce(t, group=group)
    error = None
    if dist.get_rank() == missing_rank:
        time.sleep(timeout_s + 1.0)  # a data loader stuck, an `if` only this rank takes...
    else:
        try:
            dist.all_reduce(t, group=group)
        except RuntimeError as err:
            error = str(err).strip().splitlines()[0]
    trace = dump(folder, group)
    return {"error": error, "entries": [_entry_summary(e) for e in trace["entries"]]}


def _entry_summary(entry: dict) -> dict:
    return {key: entry[key] for key in ("collective_seq_id", "profiling_name", "state",
                                        "input_sizes", "time_discovered_started_ns")}


def analyze(folder: str) -> subprocess.CompletedProcess:
    """Run torch's analyzer on the dumps, as ``torchfrtrace FOLDER -p fr_trace_`` would; its
    report (it logs to stderr) is in ``.stdout``."""
    return subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                           folder, "-p", PREFIX], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120)
