"""``%%ddp``: run a notebook cell on N ranks.

    %load_ext ddp_lab
    %%ddp -n 4 --return total --push scale
    t = torch.tensor([float(rank)]) * scale
    dist.all_reduce(t)
    total = t.item()

After the cell, ``total`` in the kernel is a list with every rank's value, in rank order.
Output, errors, timeouts and interrupts behave exactly as with ``ddp_lab.run``.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import shlex
import types

_cell_numbers = itertools.count(1)  # names each cell's source uniquely in linecache


def magic_parser() -> argparse.ArgumentParser:
    parser = _MagicParser(prog="%%ddp", add_help=False,
                          description="Run this cell on N ranks, process group ready. The "
                                      "cell sees torch, dist, rank and world_size, plus the "
                                      "--push names; anything else it imports or defines.")
    add_rank_options(parser, world_size=2)
    parser.add_argument("--return", dest="returns", default="", metavar="NAME[,NAME]",
                        help="variables to bring back: a list, one value per rank")
    parser.add_argument("--push", default="", metavar="NAME[,NAME]",
                        help="notebook variables to send to every rank")
    return parser


def add_rank_options(parser: argparse.ArgumentParser, world_size: int) -> None:
    """The options of every magic that starts ranks (%%ddp, %ddp_ranks), with --help."""
    parser.add_argument("-h", "--help", action="store_true", help="show this help")
    parser.add_argument("-n", "--world-size", type=int, default=world_size,
                        help=f"ranks (default {world_size})")
    parser.add_argument("--backend", default="auto", help="auto, gloo or nccl")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds before a hang is stopped with every rank's stack")
    parser.add_argument("--network", default=None, metavar="BANDWIDTH",
                        help="shape each rank's link, e.g. 1gbit (ddp_lab.Network)")


def parse_magic_line(line: str) -> argparse.Namespace:
    return magic_parser().parse_args(shlex.split(line))


class _MagicParser(argparse.ArgumentParser):
    def error(self, message):  # a UsageError shows as one line, not a SystemExit traceback
        from IPython.core.error import UsageError
        usage = self.format_usage().strip().removeprefix("usage: ")
        raise UsageError(f"%%ddp: {message}. Usage: {usage} (%%ddp --help says more)")


def names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def ddp(line: str, cell: str, user_ns: dict) -> None:
    """The magic's body, separate from IPython's registration so tests can call it."""
    __tracebackhide__ = True
    import ddp_lab
    from ddp_lab.launch.rank.cell import run_cell
    options = parse_magic_line(line)
    if options.help:
        print(magic_parser().format_help())
        return
    pushed = _pushed_values(names(options.push), user_ns)
    returns = names(options.returns)
    filename = _register_cell_source(cell)
    hints = notebook_names_used(cell, user_ns, pushed)
    res = ddp_lab.run(run_cell, world_size=options.world_size, backend=options.backend,
                      timeout=options.timeout, args=(cell, filename, pushed, returns, hints),
                      network=options.network)
    for name in returns:
        user_ns[name] = [value[name] for value in res.values]


def _pushed_values(wanted: tuple[str, ...], user_ns: dict) -> dict:
    from IPython.core.error import UsageError
    missing = [n for n in wanted if n not in user_ns]
    if missing:
        raise UsageError(f"%%ddp --push: {', '.join(missing)} not defined in this notebook; "
                         "run the cell that defines it first")
    return {n: user_ns[n] for n in wanted}


def notebook_names_used(cell: str, user_ns: dict, pushed: dict) -> dict:
    """Names the cell reads that exist in the notebook but will not exist on the ranks:
    name -> "module" or "variable". A rank that hits a NameError on one of them says what
    to do (import it in the cell, or --push it) instead of a bare NameError."""
    try:
        tree = ast.parse(cell)
    except SyntaxError:
        return {}  # the ranks report it, at its line
    read = {node.id for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    return {name: "module" if isinstance(user_ns[name], types.ModuleType) else "variable"
            for name in sorted(read) if name in user_ns and name not in pushed
            and not name.startswith("_")}


def _register_cell_source(cell: str) -> str:
    """A linecache entry for the cell, shipped to the ranks with the payload, so their
    tracebacks (and the kernel's stack reports) can quote its lines."""
    from ddp_lab.launch.payload import remember_source
    filename = f"<%%ddp cell {next(_cell_numbers)}>"
    remember_source(filename, cell)
    return filename


def load_ipython_extension(ipython) -> None:
    """``%load_ext ddp_lab`` calls this."""
    def ddp_magic(line: str, cell: str) -> None:
        __tracebackhide__ = True
        ddp(line, cell, ipython.user_ns)

    ddp_magic.__doc__ = __doc__
    ipython.register_magic_function(ddp_magic, magic_kind="cell", magic_name="ddp")
    from ddp_lab.launch.live.magics import register
    register(ipython)  # %ddp_ranks and %%ranks: live ranks
