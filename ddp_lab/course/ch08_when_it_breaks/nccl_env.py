"""Notebook 08b, part 4: the environment variables that matter when NCCL jobs misbehave.

Two families. ``NCCL_*`` variables are read by the NCCL library itself when it initializes
in a process (documented at https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html;
this CPU machine has no NCCL to ask). ``TORCH_NCCL_*`` and ``TORCH_FR_*`` variables are read
by torch's ProcessGroupNCCL and Flight Recorder; their names are declared in C++ headers that
ship with every torch wheel, so ``missing_from_headers`` checks each name of the table
against the installed torch (two are only in the compiled library, noted as such).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

NCCL_DOCS = "NCCL docs, env.html"
C10D = os.path.join("include", "torch", "csrc", "distributed", "c10d")


@dataclass(frozen=True)
class EnvVar:
    name: str
    meaning: str
    source: str  # a header under torch/include/.../c10d, NCCL_DOCS, or "libtorch_cpu.so"


ENV_VARS = (
    EnvVar("NCCL_DEBUG", "INFO: version, topology, transports, rings and trees at init; "
           "WARN: only problems", NCCL_DOCS),
    EnvVar("NCCL_DEBUG_SUBSYS", "limit INFO to subsystems, e.g. INIT,NET", NCCL_DOCS),
    EnvVar("NCCL_SOCKET_IFNAME", "the interface for bootstrap and socket traffic (like "
           "GLOO_SOCKET_IFNAME for gloo)", NCCL_DOCS),
    EnvVar("NCCL_IB_DISABLE", "1: no InfiniBand/RoCE, fall back to sockets", NCCL_DOCS),
    EnvVar("NCCL_P2P_DISABLE", "1: no direct GPU-to-GPU (NVLink/PCIe) transport", NCCL_DOCS),
    EnvVar("NCCL_ALGO / NCCL_PROTO", "force ring/tree and LL/LL128/Simple, to bisect a "
           "performance or correctness problem", NCCL_DOCS),
    EnvVar("TORCH_NCCL_ASYNC_ERROR_HANDLING", "what the watchdog does on a failed or timed-out "
           "collective (3, the default: tear down, skip cleanup)", "ProcessGroupNCCL.hpp"),
    EnvVar("TORCH_NCCL_BLOCKING_WAIT", "1: wait() blocks and raises on timeout in the "
           "calling thread", "ProcessGroupNCCL.hpp"),
    EnvVar("TORCH_NCCL_DUMP_ON_TIMEOUT", "dump the Flight Recorder when the watchdog sees a "
           "timeout or an error; on by default in recent releases (upstream ProcessGroupNCCL.cpp "
           "reads it with default true; the 2.13 header comment is older), so set it to be sure",
           "ProcessGroupNCCL.hpp"),
    EnvVar("TORCH_NCCL_TRACE_BUFFER_SIZE", "entries in the Flight Recorder ring (older name "
           "of TORCH_FR_BUFFER_SIZE)", "ProcessGroupNCCL.hpp"),
    EnvVar("TORCH_FR_BUFFER_SIZE", "entries in the Flight Recorder ring, 2000 by default; "
           "0 turns it off", "FlightRecorder.hpp"),
    EnvVar("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "where dumps go: a prefix, one file per rank "
           "(TORCH_FR_DUMP_TEMP_FILE is the newer name); the default /tmp/nccl_trace_rank_ is "
           "node-local, so point it at a shared folder", "libtorch_cpu.so"),
    EnvVar("TORCH_NCCL_DESYNC_DEBUG", "on timeout, report which rank is behind (with async "
           "error handling); also turns timing on; TORCH_DISTRIBUTED_DEBUG=DETAIL turns it on",
           "ProcessGroupNCCL.hpp"),
    EnvVar("TORCH_NCCL_ENABLE_MONITORING", "a heartbeat monitor that kills a process whose "
           "watchdog is stuck", "ProcessGroupNCCL.hpp"),
    EnvVar("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "how long that monitor waits",
           "ProcessGroupNCCL.hpp"),
    EnvVar("TORCH_NCCL_ENABLE_TIMING", "off by default: only with it (or desync debug) does "
           "a collective get a start event, so Flight Recorder entries get a started state, a "
           "start time and a duration", "ProcessGroupNCCL.hpp"),
    EnvVar("TORCH_NCCL_NAN_CHECK", "check collective inputs for NaN and fail on one",
           "ProcessGroupNCCL.hpp"),
    EnvVar("TORCH_NCCL_AVOID_RECORD_STREAMS", "keep references to collective buffers instead of "
           "recordStream calls (caching-allocator safety); recent releases do this by default and "
           "warn that the variable is deprecated when it is set", "ProcessGroupNCCL.hpp"),
)


def _declared_in(header: str) -> str:
    path = os.path.join(os.path.dirname(torch.__file__), C10D, header)
    with open(path, encoding="utf-8") as f:
        return f.read()


def missing_from_headers(variables=ENV_VARS) -> list[str]:
    """The table's torch variables whose name is NOT in the header named as its source
    (an empty list: every one is declared in this torch)."""
    return [v.name for v in variables if v.source.endswith(".hpp")
            and f'"{v.name}"' not in _declared_in(v.source)]


def markdown(variables=ENV_VARS) -> str:
    rows = [f"| `{v.name}` | {v.meaning} | {v.source} |" for v in variables]
    return "\n".join(["| variable | what it does | checked in |", "|---|---|---|", *rows])
