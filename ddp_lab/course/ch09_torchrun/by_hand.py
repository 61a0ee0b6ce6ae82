"""Notebook 09b, part 1: launching without a launcher's safety net.

- ``mp.spawn`` from a script, with and without the ``if __name__ == "__main__":`` guard;
- orphaned ``spawn_main`` workers: a parent killed with SIGKILL leaves its workers running
  (nothing tells them), and they are found and killed by hand with psutil;
- ``CUDA_VISIBLE_DEVICES``: which physical GPU ``cuda:k`` means, by torch's own parser.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager

import psutil

from ddp_lab.launch.network.isolation import prefix
from ddp_lab.scripts import script_path

SPAWN_SCRIPT = script_path("mp_spawn_hello.py")
ORPHAN_MARKER = "DDP_LAB_ORPHAN_DEMO"  # set in the demo's environment: only ours match


def run_python(path: str, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """``python path args``, as from a terminal, output captured; in a private network, as
    every run of the course (its rank 0 hosts a store on every interface)."""
    return subprocess.run([*prefix(wildcard=True), sys.executable, path, *args],
                          capture_output=True, text=True, timeout=timeout)


def unguarded_copy(folder: str) -> str:
    """The spawn script as many first attempts look: ``mp.spawn`` at the top level."""
    with open(SPAWN_SCRIPT) as f:
        source = f.read().split("\ndef main()")[0]
    path = os.path.join(folder, "mp_spawn_unguarded.py")
    with open(path, "w") as f:
        f.write(source + "\nmp.spawn(worker, args=(2, free_port(), 0.0), nprocs=2)\n")
    return path


def start_and_orphan(nprocs: int = 2, hold_s: float = 60.0, timeout: float = 60.0) -> dict:
    """Start the spawn script with workers that wait ``hold_s`` at the end, then SIGKILL
    the parent once every worker has reported: what a crashed or OOM-killed launcher
    leaves. Returns the marker token, the parent's pid and its workers' pids."""
    token = uuid.uuid4().hex
    parent = subprocess.Popen(
        [*prefix(wildcard=True), sys.executable, SPAWN_SCRIPT, "--nprocs", str(nprocs),
         "--hold", str(hold_s)],
        env={**os.environ, ORPHAN_MARKER: token}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines, deadline = [], time.monotonic() + timeout
    while "".join(lines).count("all_reduce sum") < nprocs:  # two workers may share a line
        if time.monotonic() > deadline or parent.poll() is not None:
            kill_marked(token)
            parent.kill()
            raise RuntimeError("the spawn script did not start:\n" + "".join(lines))
        lines.append(parent.stdout.readline())
    workers = [p.pid for p in psutil.Process(parent.pid).children(recursive=True)]
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    parent.stdout.close()
    return {"token": token, "parent": parent.pid, "workers": workers, "output": lines}


def find_marked(token: str) -> list[dict]:
    """Every live process whose environment carries the demo's token: pid, parent pid,
    whether it is a ``spawn_main`` worker, and its command line."""
    found = []
    for proc in psutil.process_iter(["pid", "ppid", "cmdline"]):
        try:
            if proc.environ().get(ORPHAN_MARKER) != token:
                continue
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        cmdline = " ".join(proc.info["cmdline"] or [])
        found.append({"pid": proc.info["pid"], "ppid": proc.info["ppid"],
                      "spawn_main": "spawn_main" in cmdline, "cmdline": cmdline[:90]})
    return found


def kill_marked(token: str, grace_s: float = 3.0) -> list[int]:
    """SIGTERM every process found by ``find_marked``, SIGKILL what is left after
    ``grace_s``; returns their pids. By hand, the same is ``pkill -f spawn_main``, but that
    would also hit every other user's workers: always select by something that is yours."""
    procs = []
    for row in find_marked(token):
        try:
            procs.append(psutil.Process(row["pid"]))
        except psutil.NoSuchProcess:
            continue
    for proc in procs:
        proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    return [p.pid for p in procs]


@contextmanager
def _visible(value: str | None):
    old = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = old


def visible_devices(value: str | None, gpus: int = 4) -> list:
    """The physical GPUs a process sees, in order, for a ``CUDA_VISIBLE_DEVICES`` value
    (None: unset) on a machine with ``gpus`` GPUs: ``cuda:k`` is the k-th of them. Parsed
    by torch's own ``torch.cuda._parse_visible_devices``, which mimics the CUDA driver."""
    import torch.cuda
    with _visible(value):
        parsed = torch.cuda._parse_visible_devices()
    if parsed and isinstance(parsed[0], str):
        return parsed  # UUIDs: the driver maps them, not shown here
    physical = []
    for ordinal in parsed:
        if ordinal >= gpus:
            break  # like the driver: an ordinal that does not exist ends the list
        physical.append(ordinal)
    return physical
