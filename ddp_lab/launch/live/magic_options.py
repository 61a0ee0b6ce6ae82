"""What every magic shares: its parser (a usage error is one line, not a SystemExit
traceback), the options of a magic that starts ranks, and the notebook names it lists or
sends.

``%%ddp`` (magic.py) and ``%ddp_ranks``/``%%ranks`` (live/magics.py) both read their line
here, so the two agree on every option they share, and neither imports the other for it.
IPython is imported only when a usage error is raised: the package works without it.
"""

from __future__ import annotations

import argparse


class MagicParser(argparse.ArgumentParser):
    """A magic's line parser: ``add_help=False`` (``-h`` is an option the magic answers
    itself, so help prints instead of exiting the kernel's cell)."""

    def __init__(self, prog: str, description: str):
        super().__init__(prog=prog, description=description, add_help=False)
        self.add_argument("-h", "--help", action="store_true", help="show this help")

    def error(self, message):  # a UsageError shows as one line, not a SystemExit traceback
        from IPython.core.error import UsageError
        usage = self.format_usage().strip().removeprefix("usage: ")
        raise UsageError(f"{self.prog}: {message}. Usage: {usage} "
                         f"({self.prog} --help says more)")


def add_rank_options(parser: argparse.ArgumentParser, world_size: int) -> None:
    """The options of every magic that starts ranks (%%ddp, %ddp_ranks): ``ddp_lab.run``'s
    and ``ddp_lab.Ranks``' own arguments, checked there."""
    parser.add_argument("-n", "--world-size", type=int, default=world_size,
                        help=f"ranks (default {world_size})")
    parser.add_argument("--backend", default="auto", help="auto, gloo or nccl")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds before a hang is stopped with every rank's stack")
    parser.add_argument("--network", default=None, metavar="BANDWIDTH",
                        help="shape each rank's link, e.g. 1gbit (ddp_lab.Network)")
    parser.add_argument("--hosts", default="", metavar="HOST[,HOST]",
                        help="run the ranks on these hosts, an agent on each")
    parser.add_argument("--nproc-per-node", type=int, default=None, metavar="N",
                        help="ranks on each host (default: world size / hosts)")
    parser.add_argument("--via", default="ssh",
                        help="how agents reach the hosts: ssh, slurm, or a template with "
                             "{host} and {command}")
    parser.add_argument("--controller", default=None, metavar="ADDRESS",
                        help="this machine's address as the hosts reach it")


def host_options(options: argparse.Namespace) -> dict:
    """The ``hosts=`` arguments of ``ddp_lab.run`` and ``ddp_lab.Ranks`` from a magic's
    line (no --hosts: this machine)."""
    hosts = names(options.hosts)
    return dict(hosts=list(hosts) if hosts else None, nproc_per_node=options.nproc_per_node,
                via=options.via, controller=options.controller)


def add_push_option(parser: argparse.ArgumentParser, when: str) -> None:
    parser.add_argument("--push", default="", metavar="NAME[,NAME]",
                        help=f"notebook variables to send to every rank{when}")


def names(text: str) -> tuple[str, ...]:
    """``"a, b,"`` -> ``("a", "b")``: the comma-separated lists of --push, --return, --on."""
    return tuple(n.strip() for n in text.split(",") if n.strip())


def pushed_values(magic: str, wanted: tuple[str, ...], user_ns: dict) -> dict:
    """The notebook's values of the --push names, or a UsageError naming the missing ones
    before anything is sent."""
    from IPython.core.error import UsageError
    missing = [n for n in wanted if n not in user_ns]
    if missing:
        raise UsageError(f"{magic} --push: {', '.join(missing)} not defined in this notebook; "
                         "run the cell that defines it first")
    return {n: user_ns[n] for n in wanted}
