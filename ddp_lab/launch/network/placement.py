"""Where a run's ranks live and how they reach each other: its placement, chosen once, when
the run's settings are checked (checks.checked_config), and asked by every part of the
launcher that used to branch on ``network=``.

A placement answers what a run needs from it:

- ``server``: which fork server forks its ranks (one per kind per kernel) and the command
  it runs under (forkserver/client.py keeps one per kind);
- ``allow``: whether a backend and a launcher can run there (before any process starts);
  ``run_backend``: the backend its ranks get once "auto" is resolved;
- ``link_plan``: what the fork server builds before the first rank (None: nothing);
- ``rank_netns`` and ``interface``: whether each rank is forked into a namespace of its
  own, and the interface gloo and NCCL use there (None: this machine's loopback);
- ``not_built``: the error when the server could not set the run's network up;
- ``store``: where the run's store already listens (None: the fork server hosts one);
- ``rank_env``: a rank's environment as the placement numbers it (one machine: as is).

Three exist: ``OnLoopback`` (every run: the private namespace of isolation.py, one
loopback), ``OnShapedLinks`` (``network=``: a shaped link per rank, setting.py and
switch.py) and ``OnHost``: one host's share of ranks spread over several hosts
(``hosts=[...]``), placed there by that host's agent (remote/agent.py), in the host's own
network, its store on the first host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ddp_lab.launch import backends
from ddp_lab.launch.network import isolation
from ddp_lab.launch.network.setting import (Network, check_network, find_tools, link_plan,
                                            not_built)
from ddp_lab.launch.network.switch import RANK_LINK


@dataclass(frozen=True)
class ServerKind:
    """A kind of fork server: the runs of all placements of one kind share one server per
    kernel, started under ``prefix()`` (a command prefix, () for none)."""

    name: str
    prefix: Callable[[], tuple[str, ...]]


def private_prefix() -> tuple[str, ...]:
    """The server, its ranks and the stores it hosts live in a network namespace of
    their own (isolation.py): no port of a run exists in the machine's namespace."""
    return isolation.prefix()


def shaped_prefix() -> tuple[str, ...]:
    """Shaped runs get a server of their own inside a new user and network namespace (the
    switch: switch.py); it is started the first time a shaped run asks for it."""
    return (find_tools()["unshare"], "--user", "--map-root-user", "--net", "--")


PRIVATE_SERVER = ServerKind("private", private_prefix)
SHAPED_SERVER = ServerKind("shaped", shaped_prefix)
# A host's agent forks its ranks in the host's own network: they reach the other hosts'
# ranks and the store on the first host, which a private namespace would cut them off from.
HOST_SERVER = ServerKind("host", tuple)


@dataclass(frozen=True)
class OnLoopback:
    """Every rank on one loopback, in the private namespace of the kernel's fork server."""

    network = None  # what the user asked for: no shaped network
    server = PRIVATE_SERVER
    rank_netns = False
    interface = None  # this machine's loopback (config.loopback_interface)

    def allow(self, backend: str, launcher: str = "ddp_lab") -> None:
        """Any backend, any launcher."""

    def run_backend(self, resolved: str) -> str:
        return resolved

    def link_plan(self, world_size: int) -> None:
        return None  # the store on loopback, nothing to build

    def not_built(self, error: str) -> Exception:
        return RuntimeError(f"the ddp_lab fork server could not host the run's store: {error}")

    store = None  # the fork server hosts it

    def rank_env(self, env: dict, rank: int) -> dict:
        return env


@dataclass(frozen=True)
class OnShapedLinks:
    """Every rank in a namespace of its own on a shaped link to one switch (setting.py)."""

    network: Network
    server = SHAPED_SERVER
    rank_netns = True
    interface = RANK_LINK  # the rank's one link

    def allow(self, backend: str, launcher: str = "ddp_lab") -> None:
        """The links carry TCP between CPU ranks, which the fork server's ranks use."""
        _refuse_nccl(backend)
        if launcher != "ddp_lab":
            raise ValueError("network= works with launcher='ddp_lab' only: torchrun's agent "
                             "starts its workers itself, outside the shaped network")

    def run_backend(self, resolved: str) -> str:
        return "gloo"  # shaped links carry TCP: gloo, never NCCL over NVLink/PCIe

    def link_plan(self, world_size: int):
        return link_plan(self.network, world_size)

    def not_built(self, error: str) -> Exception:
        return not_built(error)

    store = None  # the fork server hosts it, on the switch's bridge

    def rank_env(self, env: dict, rank: int) -> dict:
        return env


@dataclass(frozen=True)
class OnHost:
    """This host's ranks, ``first_rank`` on, of ``world_size`` spread over ``host_count``
    hosts: forked by the agent's fork server in the host's network, gloo on ``interface``
    (the one that reaches the controller and the other hosts), the store at ``store`` on
    the first host. The agent's session counts its ranks from 0 (its files, its pipes);
    the ranks see the global numbering, as torchrun's workers on several nodes do."""

    store: tuple[str, int]
    interface: str
    first_rank: int
    world_size: int
    host_index: int
    host_count: int
    network = None
    server = HOST_SERVER
    rank_netns = False

    def allow(self, backend: str, launcher: str = "ddp_lab") -> None:
        """Any backend the host's ranks can run; the controller checked the launcher."""

    def run_backend(self, resolved: str) -> str:
        return resolved

    def link_plan(self, world_size: int) -> None:
        return None

    def not_built(self, error: str) -> Exception:
        return RuntimeError(error)  # never: the store is the first host's agent's

    def rank_env(self, env: dict, rank: int) -> dict:
        """torchrun's variables for global rank ``first_rank + rank`` on this host."""
        local_size = env["LOCAL_WORLD_SIZE"]
        rank_id, world = str(self.first_rank + rank), str(self.world_size)
        return {**env, "RANK": rank_id, "ROLE_RANK": rank_id, "WORLD_SIZE": world,
                "ROLE_WORLD_SIZE": world, "GROUP_RANK": str(self.host_index),
                "LOCAL_WORLD_SIZE": local_size, "LOCAL_RANK": str(rank),
                "GROUP_WORLD_SIZE": str(self.host_count)}


@dataclass(frozen=True)
class OnHosts:
    """The controller's view of ranks on several hosts: ``nproc`` on each of ``names`` (in
    rank order), an agent per host started by ``template`` (remote/launchers.py), calling
    back to ``controller`` (this machine's address as the hosts reach it); the ranks start
    in ``cwd`` (hosts share the notebook's files). The agents place them (``OnHost``)."""

    names: tuple[str, ...]
    nproc: int
    template: str
    controller: str
    cwd: str
    network = None
    rank_netns = False
    interface = None
    store = None

    def allow(self, backend: str, launcher: str = "ddp_lab") -> None:
        if launcher != "ddp_lab":
            raise ValueError("hosts= works with launcher='ddp_lab' only")

    def run_backend(self, resolved: str) -> str:
        return resolved

    def first_ranks(self) -> list[int]:
        return [index * self.nproc for index in range(len(self.names))]

    def ranks_of(self, index: int) -> range:
        return range(index * self.nproc, (index + 1) * self.nproc)


Placement = OnLoopback | OnShapedLinks | OnHost | OnHosts
LOOPBACK = OnLoopback()


def checked_placement(network, world_size: int, backend: str) -> Placement:
    """The placement ``network=`` asks for (None: loopback), checked against the checked
    world size and backend: a ValueError/TypeError for bad input, NetworkUnavailable when
    this machine cannot shape, before any process starts."""
    if network is None:
        return LOOPBACK
    _refuse_nccl(backend)  # before the probe: the caller's to fix, whatever this machine
    return OnShapedLinks(check_network(network, world_size))


def _refuse_nccl(backend: str) -> None:
    if backends.uses_nccl(backend):
        raise ValueError("network= shapes gloo's TCP traffic between CPU ranks; NCCL on GPUs "
                         "does not go through it. Use backend='gloo' (or 'auto', which is "
                         "gloo with network=).")
