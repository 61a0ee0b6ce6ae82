"""Notebook 09b, live ranks on several hosts: the two ssh hosts of the course's test bed
(course/ssh_hosts.py: network namespaces running Debian's sshd, joined by a switch), what
the launcher runs on each, and what is left on them afterwards.

The cells call ``ddp_lab.Ranks(hosts=...)`` themselves: this module only starts the bed,
shows what a notebook cannot see from the kernel (the agent's command line, the processes
on each host) and reads the ranks' answers into rows. Where the bed cannot start (no root,
no OpenSSH server), ``start_hosts`` says why and returns None, and the section's cells do
nothing.
"""

from __future__ import annotations

import os
import time
from contextlib import ExitStack

from ddp_lab.course import netns, ssh_hosts
from ddp_lab.course.ssh_hosts import SshHosts
from ddp_lab.launch.remote.launchers import agent_command, launcher_argv

GONE_S = 20.0  # an agent hears its channel close at once; SILENCE_S (10 s) is its last resort
AGENT_MODULE = "ddp_lab.launch.remote.agent"
SERVER_MODULE = "ddp_lab.launch.forkserver.server"
SHOWN_PORT = 40000  # a stand-in for the controller's port, which each session picks anew

# What each rank reports about itself (a bare last expression is the exec's value); its
# network namespace tells the hosts apart, as the hostname cannot: the hosts share it.
WHO_AM_I = """\
import os
print("RANK", os.environ["RANK"], "LOCAL_RANK", os.environ["LOCAL_RANK"],
      "GROUP_RANK", os.environ["GROUP_RANK"], "gloo on", os.environ["GLOO_SOCKET_IFNAME"])
(int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["GROUP_RANK"]),
 os.environ["GLOO_SOCKET_IFNAME"], os.readlink("/proc/self/ns/net"))
"""


def start_hosts(cleanup: ExitStack) -> SshHosts | None:
    """Two ssh hosts, removed when ``cleanup`` closes; None (and why, printed) where this
    machine cannot run them."""
    reason = ssh_hosts.ssh_support()
    if reason:
        print(f"skipped: the two ssh hosts cannot start here ({reason})")
        return None
    return cleanup.enter_context(ssh_hosts.ssh_hosts(2))


def describe(bed: SshHosts) -> list[str]:
    """Each host as ssh knows it, and where the hosts reach this machine (``controller=``)."""
    rows = [f"{host.name}: {host.address} on interface {host.interface}" for host in bed.hosts]
    return [*rows, f"this machine on their network: {bed.machine}  (controller=)",
            f"via: {bed.via}"]


def agent_launch(bed: SshHosts, host_index: int = 0) -> list[str]:
    """The argv the kernel starts for a host's agent: the template with the host's name and
    the agent's command as one word (the port here is a stand-in). No secret in it: the
    secret goes down the launcher's stdin."""
    command = agent_command((bed.machine, SHOWN_PORT), host_index)
    return launcher_argv(bed.via, bed.hosts[host_index].name, command)


def processes_on(bed: SshHosts) -> dict[str, list[str]]:
    """What runs in each host's network namespace besides its sshd, by role: the agent,
    its fork server, and the ranks (forks of the fork server, so they carry its command
    line)."""
    import psutil
    found = {}
    for host in bed.hosts:
        roles = []
        for pid in _pids(host):
            try:
                process = psutil.Process(pid)
                if process.name() != "sshd":
                    roles.append(_role(process))
            except psutil.Error:
                continue  # gone meanwhile
        found[host.name] = sorted(roles)
    return found


def left_on_hosts(bed: SshHosts, within: float = GONE_S) -> dict[str, list[str]]:
    """``processes_on`` once nothing of ours runs on either host, or after ``within``
    seconds (what is still there, then)."""
    until = time.monotonic() + within
    left = processes_on(bed)
    while any(left.values()) and time.monotonic() < until:
        time.sleep(0.2)
        left = processes_on(bed)
    return left


def rows_of(values: list, bed: SshHosts) -> list[str]:
    """``WHO_AM_I``'s answers as one line per rank, its network namespace named after the
    bed's host that owns it."""
    owners = namespaces(bed)
    return [f"RANK {rank}  LOCAL_RANK {local}  GROUP_RANK {group}  GLOO_SOCKET_IFNAME "
            f"{interface}  in {owners.get(net, 'no host')}'s network namespace"
            for rank, local, group, interface, net in values]


def namespaces(bed: SshHosts) -> dict[str, str]:
    """Each host's network namespace as a process sees it (``/proc/PID/ns/net``: its
    inode), to the host's name."""
    return {f"net:[{(netns.NETNS_RUN / host.netns).stat().st_ino}]": host.name
            for host in bed.hosts}


def kernel_namespace() -> str:
    """This kernel's network namespace, which no rank shares."""
    return os.readlink("/proc/self/ns/net")


def _pids(host) -> list[int]:
    try:
        inode = (netns.NETNS_RUN / host.netns).stat().st_ino
    except FileNotFoundError:
        return []  # the bed is gone: nothing runs there
    return netns.pids_in(inode)


def _role(process) -> str:
    """agent, fork server, rank, or the process's own name (anything else of ours)."""
    module = _module(process.cmdline())
    if module == AGENT_MODULE:
        return "agent"
    if module == SERVER_MODULE:
        parent = process.parent()
        return "rank" if parent and _module(parent.cmdline()) == SERVER_MODULE else "fork server"
    return process.name()


def _module(argv: list[str]) -> str | None:
    """The module of a ``python -m MODULE ...`` command line."""
    return next((argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "-m"), None)
