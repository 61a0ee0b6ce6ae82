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

from ddp_lab.launch.api import run
from ddp_lab.launch.live.magic_options import (MagicParser, add_push_option, add_rank_options,
                                               host_options, names, pushed_values)
from ddp_lab.launch.live.magics import register as register_live_magics

_cell_numbers = itertools.count(1)  # names each cell's source uniquely in linecache


def magic_parser() -> argparse.ArgumentParser:
    parser = MagicParser("%%ddp", "Run this cell on N ranks, process group ready. The cell "
                                  "sees torch, dist, rank and world_size, plus the --push "
                                  "names; anything else it imports or defines.")
    add_rank_options(parser, world_size=2)
    parser.add_argument("--return", dest="returns", default="", metavar="NAME[,NAME]",
                        help="variables to bring back: a list, one value per rank")
    add_push_option(parser, when="")
    return parser


def parse_magic_line(line: str) -> argparse.Namespace:
    return magic_parser().parse_args(shlex.split(line))


def ddp(line: str, cell: str, user_ns: dict) -> None:
    """The magic's body, separate from IPython's registration so tests can call it."""
    __tracebackhide__ = True
    from ddp_lab.launch.rank.cell import run_cell
    options = parse_magic_line(line)
    if options.help:
        print(magic_parser().format_help())
        return
    pushed = pushed_values("%%ddp", names(options.push), user_ns)
    returns = names(options.returns)
    filename = _register_cell_source(cell)
    hints = notebook_names_used(cell, user_ns, pushed)
    res = run(run_cell, world_size=options.world_size, backend=options.backend,
              timeout=options.timeout, args=(cell, filename, pushed, returns, hints),
              network=options.network, **host_options(options))
    for name in returns:
        user_ns[name] = [value[name] for value in res.values]


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
    register_live_magics(ipython)  # %ddp_ranks and %%ranks: live ranks
