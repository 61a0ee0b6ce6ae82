"""Notebook 09, part 2: a two-node cluster on one machine, what breaks, and the fixes.

With root, the two nodes are network namespaces (``ddp_lab.course.netns``): separate addresses
on a virtual link, and this machine's hostname, which resolves to loopback in both, so the
usual multi-node pitfalls (unreachable port, hostname resolving to 127.0.0.1, gloo picking the
wrong interface) bite for real. Without root, both "nodes" are this machine on
loopback: the multi-node commands still run (two agents, one rendezvous), the pitfalls
cannot be shown.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ddp_lab.course import netns
from ddp_lab.launch.torchrun.agents import Agent, AgentsResult, run_agents
from ddp_lab.course.ports import free_loopback_port
from ddp_lab.course.netns import Host
from ddp_lab.launch.forkserver.process_tree import kill_tree
from ddp_lab.launch.network.isolation import PrivateNetwork

RDZV_PORT = 29400  # torchrun's usual rendezvous port: free in a fresh namespace

# The failing tries wait for timeouts, so they cut them to the least that still fails for the
# reason each try shows (their waits are most of section 7's run time):
# - the rendezvous store's ``read_timeout`` (seconds, an int: ``get_as_int`` in
#   c10d_rendezvous_backend._create_tcp_store) bounds how long an agent keeps connecting to
#   the store, plus one backoff delay of torch's TCPStore client: to a store nobody hosts in
#   try 1; in tries 2 and 3 node0's agent binds it as node1's starts to connect (both agents
#   start together);
# - print_env.py's ``--timeout``, init_process_group's: how long node0's worker waits for
#   node1's in try 2; in try 3 it also bounds how far apart the two workers may reach the
#   store, which both do within a fraction of a second of each other (started by the same
#   rendezvous round).
TRY_READ_TIMEOUT_S = 1
TRY_INIT_TIMEOUT_S = 2
# With is_host, a node whose peer failed may wait for it far longer (gloo's own connect
# timeout, several times --timeout): stop it this long after the first failure.
TRY_GRACE_S = 1.0


@dataclass(frozen=True)
class Cluster:
    """Two hosts, the rendezvous port on the first, and why namespaces were skipped
    (None when the hosts really are separate namespaces)."""

    hosts: tuple[Host, Host]
    port: int
    skipped: str | None = None

    @property
    def separate(self) -> bool:
        return self.skipped is None

    @property
    def endpoint(self) -> str:
        return f"{self.hosts[0].name}:{self.port}"


@dataclass(frozen=True)
class Fixes:
    """What a run needs when the hostname does not resolve to an address the other nodes
    can reach: tell node0 that it hosts the rendezvous store (``is_host``), make every
    agent advertise its real address (``--local-addr``), and pin gloo to the interface
    that carries it (``GLOO_SOCKET_IFNAME``)."""

    is_host: bool = True
    local_addr: bool = True
    gloo_ifname: bool = True


NO_FIXES = Fixes(is_host=False, local_addr=False, gloo_ifname=False)


@contextmanager
def local_cluster() -> Iterator[Cluster]:
    """Two network namespaces when this process may create them, else loopback twice."""
    reason = netns.namespace_support()
    if reason is None:
        with netns.two_hosts() as hosts:
            yield Cluster(hosts, RDZV_PORT)
    else:
        yield Cluster(netns.loopback_hosts(), free_loopback_port(), skipped=reason)


def cluster_agents(cluster: Cluster, target: list[str], fixes: Fixes = Fixes(), *,
                   nproc: int = 2, nnodes: str = "2", rdzv_id: str = "nb09",
                   rdzv_conf: tuple[str, ...] = (), late: str | None = None,
                   extra_env: dict | None = None) -> list[Agent]:
    """One torchrun agent per host, as you would type them on each machine. ``late``:
    node1 starts only once this text appeared in node0's output."""
    agents = []
    for i, host in enumerate(cluster.hosts):
        args = [f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={cluster.endpoint}", f"--rdzv-id={rdzv_id}"]
        conf = list(rdzv_conf)
        env = {"OMP_NUM_THREADS": "1", **(extra_env or {})}
        if cluster.separate:  # on loopback the defaults are right, and is_host would clash
            if fixes.is_host:
                conf.insert(0, f"is_host={'true' if i == 0 else 'false'}")
            if fixes.local_addr:
                args.append(f"--local-addr={host.address}")
            if fixes.gloo_ifname:
                env["GLOO_SOCKET_IFNAME"] = host.interface
        if conf:
            args.append("--rdzv-conf=" + ",".join(conf))
        agents.append(Agent(host, tuple(args + target), env, late if i else None))
    return agents


def print_commands(agents: list[Agent]) -> None:
    for i, agent in enumerate(agents):
        print(f"# node{i}\n{agent.command_line()}\n")


def try_cluster(cluster: Cluster, fixes: Fixes, timeout: float = 60.0) -> AgentsResult | None:
    """print_env.py on 2 x 1 workers with the given fixes, failing fast: the rendezvous
    store read timeout and the workers' init timeout are cut to a second or two
    (``TRY_READ_TIMEOUT_S``, ``TRY_INIT_TIMEOUT_S``). Prints the
    commands, then per node: how it ended, its workers' variables, its errors. None (and
    why) on loopback, where there is nothing to fix."""
    if not cluster.separate:
        print(f"skipped, the two nodes are this machine on loopback: {cluster.skipped}")
        return None
    agents = cluster_agents(cluster, ["-m", "ddp_lab.scripts.print_env", "--timeout",
                                      str(TRY_INIT_TIMEOUT_S)],
                            fixes, nproc=1, rdzv_conf=(f"read_timeout={TRY_READ_TIMEOUT_S}",))
    print_commands(agents)
    # Without is_host no agent hosts the store, and each fails on its own once its
    # read_timeout has passed, counted from its own start (busy cores delay one start by
    # seconds): wait for both errors. With it, a node whose peer failed may keep waiting
    # for it for a long time: stop it soon.
    grace = TRY_GRACE_S if fixes.is_host else 12.0
    result = run_agents(agents, timeout=timeout, echo=False, grace=grace)
    print(result.summary(keep=("RANK=",)))
    return result


def describe_hosts(cluster: Cluster) -> list[str]:
    """Each host's address and interface, and what its hostname resolves to there: the
    name every torchrun and gloo default starts from."""
    probe = ("import socket; n = socket.gethostname(); "
             "print(n, '->', socket.gethostbyname(n), '| fqdn:', socket.getfqdn())")
    lines = []
    for host in cluster.hosts:
        done = subprocess.run(host.command([sys.executable, "-c", probe]), capture_output=True,
                              text=True, timeout=30)
        where = host.netns or "this machine"
        lines.append(f"{host.name:9} {host.address:10} on {host.interface:12} ({where})  "
                     f"hostname {done.stdout.strip()}")
    return lines


# -- the usual connectivity check (nc -l / nc -zv) ----------------------------------------
def connectivity_check(cluster: Cluster) -> list[str]:
    """``nc -l`` on node0, ``nc -zv`` from node1 (in Python), then a port nobody listens
    on: refused means the host answered, i.e. it is reachable (what ``ping`` would say)."""
    node0, node1 = cluster.hosts
    port = cluster.port
    with PrivateNetwork() as net:  # "hosts" that are this machine: a loopback of their own
        listener = subprocess.Popen(net.command(node0, _port_check("listen", str(port),
                                                                   "--timeout", "20")),
                                    stdout=subprocess.PIPE, text=True)
        try:
            lines = [f"{node0.name}$ nc -l {port}   ->  {listener.stdout.readline().strip()}"]
            lines.append(_connect_line(net, node1, node0.name, port))
            listener.wait(timeout=20)
            lines.append(f"{node0.name}: {listener.stdout.read().strip()}")
            lines.append(_connect_line(net, node1, node0.name, port + 1))
            return lines
        finally:
            kill_tree(listener.pid)
            listener.wait()
            listener.stdout.close()


def _connect_line(net: PrivateNetwork, host: Host, target: str, port: int) -> str:
    done = subprocess.run(net.command(host, _port_check("connect", target, str(port))),
                          capture_output=True, text=True, timeout=30)
    return f"{host.name}$ nc -zv {target} {port}   ->  {done.stdout.strip()}"


def _port_check(*args: str) -> list[str]:
    return [sys.executable, "-m", "ddp_lab.scripts.port_check", *args]


# -- the real work across both hosts ------------------------------------------------------
def all_reduce_across(cluster: Cluster, timeout: float = 90.0) -> AgentsResult:
    """print_env.py on 2 nodes x 2 workers, every fix applied."""
    agents = cluster_agents(cluster, ["-m", "ddp_lab.scripts.print_env"])
    print_commands(agents)
    return run_agents(agents, timeout=timeout)


def train_across(cluster: Cluster, epochs: int = 1, timeout: float = 120.0) -> AgentsResult:
    """The CNN of notebook 06, trained by 2 nodes x 2 workers."""
    agents = cluster_agents(cluster, ["-m", "ddp_lab.scripts.train_cnn", "--epochs",
                                      str(epochs), "--batch-size", "16", "--no-progress"],
                            rdzv_id="nb09-cnn")
    print_commands(agents)
    return run_agents(agents, timeout=timeout)
