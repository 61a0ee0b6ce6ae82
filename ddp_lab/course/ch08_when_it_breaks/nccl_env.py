"""Notebook 08b, part 4: the environment variables that matter when NCCL jobs misbehave,
with their defaults and where each default was read.

Two families. ``NCCL_*`` variables are read by the NCCL library itself when it initializes
in a process (documented at https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html;
this CPU machine has no NCCL to ask). ``TORCH_NCCL_*`` and ``TORCH_FR_*`` variables are read
by torch's ProcessGroupNCCL and Flight Recorder. Their names are declared in C++ headers that
ship with every torch wheel, so ``missing_from_headers`` checks each name against the
installed torch. Most defaults live in ProcessGroupNCCL.cpp, which a CPU wheel does not ship
(``UPSTREAM``: read in upstream's source of the generation whose members 2.13's header
declares); the rest are checked here by ``unproven_defaults``, against text in this torch's
headers, its Python files or the strings of its ``libtorch_cpu.so``.
"""

from __future__ import annotations

import mmap
import os
import re
from dataclasses import dataclass
from functools import cache

import torch

from ddp_lab.launch.torchrun.command import TorchrunResult, torchrun

NCCL_DOCS = "NCCL docs, env.html"
UPSTREAM = "ProcessGroupNCCL.cpp*"
LIBRARY = "libtorch_cpu.so"
C10D = os.path.join("include", "torch", "csrc", "distributed", "c10d")
# Where the files named as evidence are, inside the installed torch.
FILES = {"ProcessGroupNCCL.hpp": os.path.join(C10D, "ProcessGroupNCCL.hpp"),
         "FlightRecorder.hpp": os.path.join(C10D, "FlightRecorder.hpp"),
         "local_elastic_agent.py": os.path.join("distributed", "elastic", "agent", "server",
                                                "local_elastic_agent.py"),
         LIBRARY: os.path.join("lib", LIBRARY)}


@dataclass(frozen=True)
class EnvVar:
    name: str
    meaning: str
    source: str  # where the name is declared: a header under c10d, NCCL_DOCS or LIBRARY
    default: str = ""
    default_from: str = ""  # NCCL_DOCS, UPSTREAM, or a file of FILES
    evidence: tuple[str, ...] = ()  # texts that must all be in ``default_from``'s file


_PG = "ProcessGroupNCCL.hpp"
ENV_VARS = (
    EnvVar("NCCL_DEBUG", "INFO: version, topology, transports, rings and trees at init; "
           "WARN: only problems", NCCL_DOCS, "unset: quiet", NCCL_DOCS),
    EnvVar("NCCL_DEBUG_SUBSYS", "limit the output to subsystems, e.g. INIT,NET", NCCL_DOCS,
           "INIT,BOOTSTRAP,ENV", NCCL_DOCS),
    EnvVar("NCCL_SOCKET_IFNAME", "the interfaces for bootstrap and socket traffic (like "
           "GLOO_SOCKET_IFNAME for gloo)", NCCL_DOCS, "unset: ib* first; lo and docker* only "
           "if nothing else", NCCL_DOCS),
    EnvVar("NCCL_IB_DISABLE", "1: no InfiniBand/RoCE, fall back to sockets", NCCL_DOCS,
           "0", NCCL_DOCS),
    EnvVar("NCCL_P2P_DISABLE", "1: no direct GPU-to-GPU (NVLink/PCIe) transport", NCCL_DOCS,
           "unset: P2P where the topology allows", NCCL_DOCS),
    EnvVar("NCCL_ALGO / NCCL_PROTO", "force ring/tree and LL/LL128/Simple, to bisect a "
           "performance or correctness problem", NCCL_DOCS,
           "unset: NCCL's tuner picks per call", NCCL_DOCS),
    EnvVar("TORCH_NCCL_ASYNC_ERROR_HANDLING", "what the watchdog does on a failed or timed-out "
           "collective: 0 nothing, 1 abort the communicators and tear the process down, 2 abort "
           "only, 3 tear down without abort", _PG, f"3 ({UPSTREAM}); 1 under torchrun, whose "
           "agent sets it for every worker that lacks it", "local_elastic_agent.py",
           ('"TORCH_NCCL_ASYNC_ERROR_HANDLING": os.getenv( "TORCH_NCCL_ASYNC_ERROR_HANDLING", '
            'str(1) )',)),
    EnvVar("TORCH_NCCL_BLOCKING_WAIT", "1: wait() blocks and raises on timeout in the "
           "calling thread, and no watchdog thread is started", _PG, "0", UPSTREAM),
    EnvVar("TORCH_NCCL_DUMP_ON_TIMEOUT", "dump the Flight Recorder when a collective times out "
           "or fails (the 2.13 header comment about it is older than the code)", _PG, "1",
           UPSTREAM),
    EnvVar("TORCH_NCCL_TRACE_BUFFER_SIZE", "entries in the Flight Recorder ring (older name "
           "of TORCH_FR_BUFFER_SIZE)", _PG, "2000", "FlightRecorder.hpp",
           ('{"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}, 2000)',)),
    EnvVar("TORCH_FR_BUFFER_SIZE", "entries in the Flight Recorder ring; 0 turns it off",
           "FlightRecorder.hpp", "2000", "FlightRecorder.hpp",
           ('{"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}, 2000)',)),
    EnvVar("TORCH_FR_CPP_STACK", "also record each collective's C++ stack (older name "
           "TORCH_NCCL_TRACE_CPP_STACK; costly)", "FlightRecorder.hpp", "0",
           "FlightRecorder.hpp", ('{"TORCH_FR_CPP_STACK", "TORCH_NCCL_TRACE_CPP_STACK"}, '
                                  'false)',)),
    EnvVar("TORCH_FR_DUMP_TEMP_FILE / TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "where dumps go: a "
           "prefix, the global rank appended; node-local unless it names a shared folder",
           LIBRARY, "$XDG_CACHE_HOME/torch/comm_lib_trace_rank_, else "
           "~/.cache/torch/comm_lib_trace_rank_", LIBRARY,
           ("XDG_CACHE_HOME", "/.cache", "/torch", "comm_lib_trace_r")),
    EnvVar("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "on-demand dumps: rank r makes the named pipe "
           "<value><r>.pipe, and anything written to it dumps the Flight Recorder while the "
           "job runs on", f"{_PG} (comment)", "unset: no pipe", UPSTREAM),
    EnvVar("TORCH_NCCL_DESYNC_DEBUG", "on timeout, report which rank is behind; turns timing "
           "on; TORCH_DISTRIBUTED_DEBUG=DETAIL turns it on", _PG, "0", UPSTREAM),
    EnvVar("TORCH_NCCL_ENABLE_TIMING", "record a start event per collective: Flight Recorder "
           "entries get a started state, a start time and a duration", _PG, "0", UPSTREAM),
    EnvVar("TORCH_NCCL_PROPAGATE_ERROR", "1: the rank whose collective failed writes a "
           "signal to the store, and the other ranks' watchdogs record a remote error", _PG, "0",
           UPSTREAM),
    EnvVar("TORCH_NCCL_EXTRA_DUMP_ON_EXEC", "1: also dump when the watchdog dies of an "
           "exception or the group is aborted", _PG, "0", UPSTREAM),
    EnvVar("TORCH_NCCL_ENABLE_MONITORING", "a heartbeat monitor that kills a process whose "
           "watchdog is stuck", _PG, "1", UPSTREAM),
    EnvVar("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "how long that monitor waits", _PG,
           "480 (8 min)", UPSTREAM),
    EnvVar("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", "how long a dump may take; the watchdog "
           "waits 4 times this before it raises, so that every rank can dump", _PG, "15000",
           UPSTREAM),
    EnvVar("TORCH_NCCL_NAN_CHECK", "check collective inputs for NaN and fail on one", _PG, "0",
           UPSTREAM),
    EnvVar("TORCH_NCCL_AVOID_RECORD_STREAMS", "keep references to collective buffers instead of "
           "recordStream calls (caching-allocator safety)", _PG, "ignored: this is the "
           "default behaviour; setting it only warns that it is deprecated", UPSTREAM),
)


def _installed(relative: str) -> str:
    return os.path.join(os.path.dirname(torch.__file__), relative)


def _declared_in(header: str) -> str:
    with open(_installed(os.path.join(C10D, header)), encoding="utf-8") as f:
        return f.read()


def missing_from_headers(variables=ENV_VARS) -> list[str]:
    """The table's torch variables whose name is NOT in the header named as its source
    (an empty list: every one is declared in this torch)."""
    return [v.name for v in variables if v.source.endswith(".hpp")
            and f'"{v.name}"' not in _declared_in(v.source)]


@cache
def _contains(name: str, text: str) -> bool:
    """Whether a file of FILES holds ``text``: the library among its bytes (its strings),
    the others with every run of whitespace read as one space (across line breaks)."""
    path = _installed(FILES[name])
    if name == LIBRARY:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(text.encode()) != -1
    with open(path, encoding="utf-8") as f:
        return text in re.sub(r"\s+", " ", f.read())


def unproven_defaults(variables=ENV_VARS) -> list[str]:
    """The variables whose default is said to come from a file of this torch but whose
    evidence is not in that file (an empty list: every such default checked)."""
    return [v.name for v in variables if v.default_from in FILES
            and not all(_contains(v.default_from, text) for text in v.evidence)]


def seen_by_torchrun_workers(name: str = "TORCH_NCCL_ASYNC_ERROR_HANDLING") -> TorchrunResult:
    """``torchrun --standalone --nproc-per-node=1 --no-python printenv NAME``: the value a
    worker gets, whatever the agent adds to its environment."""
    return torchrun(["--no-python", "printenv", name], 1)


def markdown(variables=ENV_VARS) -> str:
    rows = [f"| `{v.name}` | {v.meaning} | {v.default} | {v.default_from} | {v.source} |"
            for v in variables]
    return "\n".join(["| variable | what it does | default | default read in | declared in |",
                      "|---|---|---|---|---|", *rows])
