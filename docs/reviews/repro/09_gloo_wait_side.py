"""Review of notebook 09, cell 31 (try 3): how long each side of gloo's connectFullMesh
takes to give up when both ranks advertise [127.0.0.1]:port across two hosts.

Two plain workers (no torchrun), one in each of the notebook's two namespaces, rank 0
hosting the TCPStore on 10.213.0.1 (reachable from both), no GLOO_SOCKET_IFNAME: gloo
picks the interface from the hostname (127.0.0.1), as in try 3. Each worker prints how
long init_process_group took to fail and with what. Run with each --timeout given.

    flock /tmp/ddp-lab-cpu.lock .venv/bin/python docs/reviews/repro/09_gloo_wait_side.py 2 4
"""

import subprocess
import sys

from ddp_lab.course import netns

WORKER = r"""
import os, sys, time, datetime
import torch.distributed as dist
rank, timeout, addr, port = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
os.environ.pop("GLOO_SOCKET_IFNAME", None)
store = dist.TCPStore(addr, int(port), 2, is_master=(rank == 0),
                      timeout=datetime.timedelta(seconds=30))
store.set(f"ready{rank}", "1"); store.wait(["ready0", "ready1"])   # both reach gloo together
t0 = time.monotonic()
try:
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=timeout))
    print(f"rank {rank}: connected after {time.monotonic() - t0:.2f} s", flush=True)
except Exception as err:
    msg = str(err).splitlines()[0][:200]
    print(f"rank {rank}: failed after {time.monotonic() - t0:.2f} s: {type(err).__name__}: {msg}",
          flush=True)
if rank == 0:
    time.sleep(2 * timeout + 20)   # keep the store up so rank 1 is not cut short
"""


def main(timeouts):
    with netns.two_hosts() as hosts:
        for timeout in timeouts:
            print(f"--- init_process_group(timeout={timeout} s)")
            procs = [subprocess.Popen(h.command([sys.executable, "-c", WORKER, str(r), str(timeout),
                                                  hosts[0].address, "29500"]),
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                     for r, h in enumerate(hosts)]
            lines = []
            for p in procs:
                lines.append(p.stdout.readline().strip())
            for p in procs:
                p.kill()
                p.wait()
            print(*sorted(lines), sep="\n")


if __name__ == "__main__":
    main([float(a) for a in sys.argv[1:]] or [2.0])

# Output (2026-11-29, torch 2.13, 2 busy cores):
# --- init_process_group(timeout=2.0 s)
# rank 0: failed after 10.01 s: RuntimeError: Gloo connectFullMesh failed with [.../gloo/transport/tcp/pair.h:311] Connect timeout [none]
# rank 1: failed after 0.01 s: RuntimeError: Gloo connectFullMesh failed with [.../gloo/transport/tcp/pair.cc:152] timed out connecting: SO_ERROR: Connection refused, remote=[127.0.0.1]:14728$1
# --- init_process_group(timeout=4.0 s)
# rank 0: failed after 20.01 s: ... pair.h:311] Connect timeout [none]
# rank 1: failed after 0.01 s: ... pair.cc:152] timed out connecting: SO_ERROR: Connection refused, remote=[127.0.0.1]:35214$1
