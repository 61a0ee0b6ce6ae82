"""The rank side of the ``%%ddp`` magic: run a cell's source with the process group ready.

The cell runs as a module-level script in a fresh namespace that already holds ``torch``,
``dist`` (torch.distributed), ``rank`` and ``world_size``, plus any variables pushed from the
kernel. Its compiled file name is the one the kernel registered in linecache, so tracebacks
and timeout stacks quote the cell's own lines.
"""

from __future__ import annotations


def run_cell(source: str, filename: str, pushed: dict, return_names: tuple) -> dict:
    import torch
    import torch.distributed as dist
    namespace = {"__name__": "__main__", "torch": torch, "dist": dist,
                 "rank": dist.get_rank(), "world_size": dist.get_world_size(), **pushed}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - the user's own cell
    missing = [name for name in return_names if name not in namespace]
    if missing:
        raise NameError(f"--return {','.join(missing)}: the cell did not define "
                        f"{', '.join(missing)} on rank {dist.get_rank()}")
    return {name: namespace[name] for name in return_names}
