"""``%ddp_ranks`` and ``%%ranks``: the notebook's live ranks, started once, used by cells.

    %load_ext ddp_lab
    %ddp_ranks -n 4             # start the notebook's ranks (again: restart them)
    %%ranks                     # this cell on every rank; what it defines stays there
    model = torch.nn.Linear(4, 2)
    %%ranks --on 0              # on rank 0 only
    model.weight.grad
    %ddp_ranks --stop           # stop them

The cell's output appears live under it, ``[rank N]``-tagged; a last bare expression is
shown per rank, as a cell shows its value. Errors are ``ddp_lab.Ranks``'s.
"""

from __future__ import annotations

import argparse
import shlex

from ddp_lab.launch.errors import describe_ranks
from ddp_lab.launch.live.handle import Ranks
from ddp_lab.launch.live.magic_options import (MagicParser, add_push_option, add_rank_options,
                                               host_options, names, pushed_values)


def ranks_line_parser() -> argparse.ArgumentParser:
    parser = MagicParser("%ddp_ranks", "Start the notebook's live ranks (restart them if "
                                       "running); %%ranks cells then run in them.")
    add_rank_options(parser, world_size=4)
    parser.add_argument("--stop", action="store_true", help="stop the ranks")
    return parser


def ranks_cell_parser() -> argparse.ArgumentParser:
    parser = MagicParser("%%ranks", "Run this cell in the live ranks started by %ddp_ranks.")
    parser.add_argument("--on", default="", metavar="RANK[,RANK]",
                        help="only these ranks (default: all)")
    add_push_option(parser, when=" first")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds this cell may run (default: the ranks' timeout)")
    return parser


class LiveMagics:
    """The notebook's one ``Ranks`` and the two magics that use it."""

    def __init__(self, user_ns: dict):
        self.user_ns = user_ns
        self.ranks: Ranks | None = None

    def line(self, line: str) -> Ranks | None:
        __tracebackhide__ = True
        options = ranks_line_parser().parse_args(shlex.split(line))
        if options.help:
            print(ranks_line_parser().format_help())
            return None
        if self.ranks is not None:
            self.ranks.close()
            self.ranks = None
        if options.stop:
            return None
        self.ranks = Ranks(options.world_size, backend=options.backend,
                           network=options.network, timeout=options.timeout,
                           **host_options(options))
        return self.ranks

    def cell(self, line: str, cell: str) -> None:
        __tracebackhide__ = True
        from IPython.core.error import UsageError
        options = ranks_cell_parser().parse_args(shlex.split(line))
        if options.help:
            print(ranks_cell_parser().format_help())
            return
        if self.ranks is None or self.ranks.state == "closed":
            raise UsageError("%%ranks: no live ranks yet; start them with %ddp_ranks -n 4")
        pushed = pushed_values("%%ranks", names(options.push), self.user_ns)
        if pushed:
            self.ranks.push(**pushed)
        on = [int(r) for r in names(options.on)] or None
        res = self.ranks.exec(cell, on=on, timeout=options.timeout)
        _show_values(on or list(range(self.ranks.world_size)), res.values)


def _show_values(ranks: list[int], values: list) -> None:
    """A last bare expression's value per rank, as ``Out`` would show it; equal values
    once, under every rank that has it."""
    shown = [(r, v) for r, v in zip(ranks, values) if v is not None]
    if not shown:
        return
    texts = [repr(v) for _, v in shown]
    if len(set(texts)) == 1 and len(shown) > 1:
        print(f"[{describe_ranks([r for r, _ in shown])}] Out: {texts[0]}")
        return
    for (rank, _), text in zip(shown, texts):
        print(f"[rank {rank}] Out: {text}")


def register(ipython) -> None:
    """Called by ``%load_ext ddp_lab`` (magic.py's ``load_ipython_extension``)."""
    magics = LiveMagics(ipython.user_ns)

    def ddp_ranks(line: str):
        __tracebackhide__ = True
        return magics.line(line)

    def ranks(line: str, cell: str) -> None:
        __tracebackhide__ = True
        magics.cell(line, cell)

    ddp_ranks.__doc__ = ranks.__doc__ = __doc__
    ipython.register_magic_function(ddp_ranks, magic_kind="line", magic_name="ddp_ranks")
    ipython.register_magic_function(ranks, magic_kind="cell", magic_name="ranks")
