"""Is a gloo barrier interruptible by SIGINT (torch 2.13, CPU)? Rank 0 enters dist.barrier();
rank 1 joins only after 6 s. The parent sends SIGINT to rank 0 after 1 s. We print when rank
0's KeyboardInterrupt is raised (if at all) relative to the barrier's start."""
import os, signal, socket, subprocess, sys, time

CHILD = r"""
import os, sys, time, torch.distributed as dist
from datetime import timedelta
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", timeout=timedelta(seconds=30))
if rank == 1:
    time.sleep(6)
t0 = time.monotonic()
print(f"rank {rank} enters barrier", flush=True)
try:
    dist.barrier()
    print(f"rank {rank} left barrier after {time.monotonic()-t0:.1f} s", flush=True)
except KeyboardInterrupt:
    print(f"rank {rank} KeyboardInterrupt after {time.monotonic()-t0:.1f} s", flush=True)
dist.destroy_process_group()
"""

def main():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    procs = []
    for r in range(2):
        env = {**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo"}
        procs.append(subprocess.Popen([sys.executable, "-c", CHILD], env=env,
                                      stdout=subprocess.PIPE if r == 0 else None, text=True))
    line = procs[0].stdout.readline()  # "rank 0 enters barrier"
    print(line, end="", flush=True)
    time.sleep(1)
    print("parent: SIGINT to rank 0", flush=True)
    procs[0].send_signal(signal.SIGINT)
    print(procs[0].stdout.read(), end="")
    for p in procs:
        p.wait(timeout=60)
    print("exit codes", [p.returncode for p in procs])

main()
