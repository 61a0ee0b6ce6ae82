"""What sandbox.py asks of its helper, checked (stdlib only): the command, its folder,
its budgets, the folders it needs, the paths to hide, and the user it runs as.

A folder is refused where the sandbox cannot be built around it: the root (its parent is
hidden, and would be everything), a folder beside or above the Python or the ddp_lab
package the command needs. A hidden path is refused where hiding it would hide the folder
or what the command needs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

PACKAGE_HOME = Path(__file__).resolve().parents[2]  # the folder that holds ddp_lab


def orders(argv, folder, wall_s, memory_bytes, max_processes, env, hidden,
           user: tuple[int, int]) -> dict:
    """The helper's orders (JSON-ready), after checking what the caller gave."""
    if not argv or not all(isinstance(arg, str) for arg in argv):
        raise ValueError(f"argv must be a non-empty list of strings, not {argv!r}")
    if wall_s <= 0 or memory_bytes <= 0 or max_processes < 1:
        raise ValueError("wall_s, memory_bytes and max_processes must be positive "
                         f"(got {wall_s}, {memory_bytes}, {max_processes})")
    place = Path(folder).resolve(strict=True)
    needed = sorted({Path(p).resolve() for p in (sys.base_prefix, sys.prefix, PACKAGE_HOME)})
    check_folder(place, needed)
    hide = [Path(p).resolve() for p in hidden]
    for path in hide:
        check_hidden(path, place, needed)
    if env is None:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return {"argv": list(argv), "folder": str(place), "needed": [str(p) for p in needed],
            "hidden": [str(p) for p in hide if os.path.lexists(p)],
            "env": {"HOME": "/tmp", "TMPDIR": "/tmp", **env}, "uid": user[0], "gid": user[1],
            "memory_bytes": int(memory_bytes), "max_processes": int(max_processes),
            "caller": os.getpid()}


def check_folder(place: Path, needed: list[Path]) -> None:
    """The folder must be a folder whose parent can be hidden."""
    if not place.is_dir():
        raise ValueError(f"{place} is not a folder: give run_sandboxed the folder the "
                         "command may write in")
    if place.parent == place or place.parent == Path("/"):
        raise ValueError(f"{place} cannot be sandboxed: its parent would be hidden, and "
                         "that is the root; use a folder inside a folder of its own")
    for path in needed:
        if _holds(place.parent, path):
            raise ValueError(f"{place}: its parent is hidden inside the sandbox, and it "
                             f"holds {path}, which the command needs; put the folder in a "
                             "folder of its own (a temporary folder, say)")


def check_hidden(path: Path, place: Path, needed: list[Path]) -> None:
    for kept in (place, *needed):
        if _holds(path, kept):
            raise ValueError(f"{path} cannot be hidden from the sandbox: it holds {kept}, "
                             "which the command needs; hide the paths inside it instead")


def _holds(folder: Path, path: Path) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it."""
    return folder == path or folder in path.parents
