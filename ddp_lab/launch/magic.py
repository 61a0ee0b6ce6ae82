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
import itertools
import linecache
import shlex

_cell_numbers = itertools.count(1)  # names each cell's source uniquely in linecache


def parse_magic_line(line: str) -> argparse.Namespace:
    parser = _MagicParser(prog="%%ddp", add_help=False,
                          description="Run this cell on N ranks, process group ready.")
    parser.add_argument("-n", "--world-size", type=int, default=2)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--return", dest="returns", default="", metavar="NAME[,NAME]")
    parser.add_argument("--push", default="", metavar="NAME[,NAME]")
    parser.add_argument("--network", default=None, metavar="BANDWIDTH",
                        help="shape each rank's link, e.g. 1gbit (ddp_lab.Network)")
    return parser.parse_args(shlex.split(line))


class _MagicParser(argparse.ArgumentParser):
    def error(self, message):  # a UsageError shows as one line, not a SystemExit traceback
        from IPython.core.error import UsageError
        raise UsageError(f"%%ddp: {message}. Usage: {self.format_usage().strip()}")


def names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def ddp(line: str, cell: str, user_ns: dict) -> None:
    """The magic's body, separate from IPython's registration so tests can call it."""
    __tracebackhide__ = True
    import ddp_lab
    from ddp_lab.launch.cell import run_cell
    options = parse_magic_line(line)
    pushed = _pushed_values(names(options.push), user_ns)
    returns = names(options.returns)
    filename = _register_cell_source(cell)
    res = ddp_lab.run(run_cell, world_size=options.world_size, backend=options.backend,
                      timeout=options.timeout, args=(cell, filename, pushed, returns),
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


def _register_cell_source(cell: str) -> str:
    """A linecache entry for the cell, shipped to the ranks with the payload, so their
    tracebacks (and the kernel's stack reports) can quote its lines."""
    filename = f"<%%ddp cell {next(_cell_numbers)}>"
    lines = cell.splitlines(keepends=True)
    linecache.cache[filename] = (len(cell), None, lines, filename)
    return filename


def load_ipython_extension(ipython) -> None:
    """``%load_ext ddp_lab`` calls this."""
    def ddp_magic(line: str, cell: str) -> None:
        __tracebackhide__ = True
        ddp(line, cell, ipython.user_ns)

    ddp_magic.__doc__ = __doc__
    ipython.register_magic_function(ddp_magic, magic_kind="cell", magic_name="ddp")
