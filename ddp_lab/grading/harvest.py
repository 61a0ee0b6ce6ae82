"""Inside the sandbox: run each kernel notebook of a submission in its own fresh kernel, so
that each exercise cell leaves its function as a payload file (kernel_cells.py builds the
notebooks; this only runs them).

    python -m ddp_lab.grading.harvest CELL_TIMEOUT NOTEBOOK.ipynb...

The notebooks' folder is the kernel's working folder, where the payloads land. A cell that
runs past ``CELL_TIMEOUT`` seconds is interrupted and the notebook goes on (a loop in one
exercise cell costs that exercise only); a kernel that dies ends its notebook. What each
cell raised is printed as one JSON line per notebook: the grade may quote it beside "no
function NAME in the notebook", and trusts nothing else of it. A cell's error is taken from
the kernel's reply to it first (nbclient's own reply when the cell timed out), then from its
outputs: a kernel wedged by its own cell (a fork bomb interrupted mid-fork) may never send
the error output, and the reason must not be lost with it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from ddp_lab.tools.notebook_runner import CurrentInterpreterKernel, kernel_env

ERRORS_MARK = "ddp-lab-harvest:"
LEFT_MARK = "ddp-lab-harvest-left:"  # then how many processes the kernels left running


def run_notebook(path: Path, cell_timeout: float) -> dict[int, str]:
    """Run ``path`` in a fresh kernel in its folder; return each failed cell's error line."""
    nb = nbformat.read(path, as_version=4)
    replied: dict[int, str] = {}
    manager = CurrentInterpreterKernel(kernel_name="python3")
    client = NotebookClient(
        nb, km=manager, timeout=cell_timeout, allow_errors=True,
        interrupt_on_timeout=True,
        error_on_timeout={"ename": "TimeoutError", "evalue": _ran_past(cell_timeout),
                          "traceback": []},
        resources={"metadata": {"path": str(path.parent)}},
        extra_arguments=["--IPKernelApp.log_level=ERROR"],
        on_cell_error=lambda cell, cell_index, execute_reply: replied.setdefault(
            cell_index, _said(execute_reply.get("content", {}), cell_timeout)))
    died = ""
    try:
        client.execute(env=kernel_env(), cleanup_kc=True)
    except Exception as exc:  # noqa: BLE001 - a dead kernel ends this notebook only
        died = f"the kernel stopped: {type(exc).__name__}: {str(exc)[:200]}"
    finally:
        manager.cleanup_connection_file()
    errors = {i: said for i, cell in enumerate(nb.cells)
              if (said := replied.get(i) or _error_line(cell, cell_timeout))}
    if died:
        errors[-1] = died
    return errors


def _error_line(cell, cell_timeout: float) -> str:
    """The first error output of ``cell`` in a line ("" when it has none)."""
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    return _said(errors[0], cell_timeout) if errors else ""


def _said(error: dict, cell_timeout: float) -> str:
    """An error output or an error reply's content in a line."""
    if error.get("ename") == "KeyboardInterrupt":  # only a timeout interrupts the kernel
        return f"TimeoutError: {_ran_past(cell_timeout)}"
    return f"{error.get('ename', '')}: {str(error.get('evalue', ''))[:300]}"


def _ran_past(cell_timeout: float) -> str:
    return f"it ran past the {cell_timeout:g} s a cell may run"


def left_running() -> int:
    """How many processes of this sandbox (its own PID namespace) still run besides this
    one and those above it: what a kernel forked and left. A fork bomb that a cell's timeout
    interrupted before the process budget stopped it leaves hundreds (jupyter_client
    interrupts the kernel's whole process group, so its children wake as copies of it)."""
    mine, pid = set(), os.getpid()
    while pid > 0:
        mine.add(pid)
        pid = _parent(pid)
    return sum(1 for entry in os.listdir("/proc")
               if entry.isdigit() and int(entry) not in mine and _parent(int(entry)) >= 0)


def _parent(pid: int) -> int:
    """``pid``'s parent (0 at the top), or -1 if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return -1
    return -1 if fields[0] == "Z" else int(fields[1])


def main(argv: list[str]) -> int:
    cell_timeout = float(argv[0])
    for name in argv[1:]:
        errors = run_notebook(Path(name).resolve(), cell_timeout)
        print(ERRORS_MARK + json.dumps({"notebook": name, "errors": errors}), flush=True)
    print(f"{LEFT_MARK}{left_running()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
