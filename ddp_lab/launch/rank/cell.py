"""The rank side of the ``%%ddp`` magic: run a cell's source with the process group ready.

The cell runs as a module-level script in a fresh namespace that already holds ``torch``,
``dist`` (torch.distributed), ``rank`` and ``world_size``, plus any variables pushed from the
kernel. Its compiled file name is the one the kernel registered in linecache, so tracebacks
and timeout stacks quote the cell's own lines.
"""

from __future__ import annotations


def run_cell(source: str, filename: str, pushed: dict, return_names: tuple,
             hints: dict | None = None) -> dict:
    import torch
    import torch.distributed as dist
    namespace = {"__name__": "__main__", "torch": torch, "dist": dist,
                 "rank": dist.get_rank(), "world_size": dist.get_world_size(), **pushed}
    try:
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - the user's own cell
    except NameError as exc:
        exc.args = (explain_missing_name(exc, hints or {}),)
        raise  # the traceback still ends at the cell's line
    missing = [name for name in return_names if name not in namespace]
    if missing:
        raise NameError(f"--return {','.join(missing)}: the cell did not define "
                        f"{', '.join(missing)} on rank {dist.get_rank()}")
    return {name: namespace[name] for name in return_names}


def explain_missing_name(exc: NameError, hints: dict) -> str:
    """NameError's message plus what to do: ranks are fresh processes that do not share the
    notebook's variables or imports."""
    name = getattr(exc, "name", None)
    kind = hints.get(name)
    if kind == "module":
        advice = (f"{name!r} is a module imported in the notebook; the ranks are separate "
                  f"processes: import it inside the %%ddp cell")
    elif kind == "variable":
        advice = (f"{name!r} is defined in the notebook, not on the ranks: add --push {name} "
                  f"to the %%ddp line (or define it inside the cell)")
    else:
        advice = ("a %%ddp cell sees torch, dist, rank, world_size and the --push names; "
                  "import or define anything else inside the cell")
    return f"{exc.args[0] if exc.args else exc}: {advice}"

