"""The link to node1 is cut while a call runs: ranks 0 and 1 (node0) wait in an all_reduce
for ranks 2 and 3 (node1), which sleep first. What does the call raise, after how long,
what is err.session, and is anything left on either host? (tests/launch/test_remote_ranks.py
cuts the link only between calls.) Needs root and openssh-server (course/ssh_hosts)."""
import subprocess, threading, time
from contextlib import ExitStack

import ddp_lab
from ddp_lab.course import ssh_hosts
from ddp_lab.course.ch09_torchrun import hosts_demo

with ExitStack() as cleanup:
    bed = cleanup.enter_context(ssh_hosts.ssh_hosts(2))
    ranks = cleanup.enter_context(ddp_lab.Ranks(
        4, hosts=[h.name for h in bed.hosts], nproc_per_node=2, via=bed.via,
        controller=bed.machine, timeout=60, echo=False))
    lost = bed.hosts[1]
    cut = ["ip", "-n", lost.netns, "link", "set", lost.interface]
    timer = threading.Timer(1.0, subprocess.run, ([*cut, "down"],), {"check": True})
    started = time.monotonic()
    timer.start()
    try:
        ranks.exec("import time\nif rank >= 2:\n    time.sleep(3)\n"
                   "t = torch.ones(1)\ndist.all_reduce(t)\nt.item()")
        print("no error!")
    except Exception as err:  # noqa: BLE001
        print(f"after {time.monotonic() - started:.1f} s: {type(err).__name__}, "
              f"session={getattr(err, 'session', None)!r}, state={ranks.state!r}")
        print(str(err)[:1500])
    timer.join()
    subprocess.run([*cut, "up"], check=True)
    print("left on the hosts:", hosts_demo.left_on_hosts(bed))
    ranks.close()
    print("after close:", hosts_demo.left_on_hosts(bed))
