"""Cell 52: "the next call raises WorkerError saying host 'node1' was lost". The link to
node1 is cut between calls (as tests/launch/test_remote_ranks.py does); what is the error's
headline? Needs root and openssh-server."""
import subprocess, time
from contextlib import ExitStack

import ddp_lab
from ddp_lab.course import ssh_hosts
from ddp_lab.course.ch09_torchrun import hosts_demo

with ExitStack() as cleanup:
    bed = cleanup.enter_context(ssh_hosts.ssh_hosts(2))
    ranks = cleanup.enter_context(ddp_lab.Ranks(
        4, hosts=[h.name for h in bed.hosts], nproc_per_node=2, via=bed.via,
        controller=bed.machine, echo=False))
    lost = bed.hosts[1]
    cut = ["ip", "-n", lost.netns, "link", "set", lost.interface]
    subprocess.run([*cut, "down"], check=True)
    time.sleep(12)  # past SILENCE_S on both sides
    try:
        ranks.exec("rank")
    except ddp_lab.WorkerError as err:
        print(f"session={err.session!r} rank={err.rank} exitcode={err.exitcode}")
        print(str(err))
    subprocess.run([*cut, "up"], check=True)
    ranks.close()
    print("after close:", hosts_demo.left_on_hosts(bed))
