"""``python -m ddp_lab.launch.torchrun.agent ARGS`` is ``torchrun ARGS`` with two additions.

It runs torch's own launcher code (``torch.distributed.run``: same arguments, same elastic
agent, same rendezvous, same worker environment), and

1. writes the failures the agent saw (which rank, exit code, error file) as JSON to
   ``$DDP_LAB_RUN_DIR/torchrun_failures.json`` instead of printing torchrun's summary:
   ``run_script(..., launcher="torchrun")`` turns them into a ``WorkerError``;
2. stops as on SIGTERM (torchrun then stops its workers) when its stdin reaches end of
   file, i.e. when the launcher that holds the other end is gone, even killed by SIGKILL:
   the same "no orphan" lifeline the default launcher gives its ranks (it then removes
   the run folder too, which its launcher no longer can);
3. is a child subreaper (Linux): a worker's helper that moved to a session of its own and
   lost its parent becomes the agent's child instead of init's, and once torchrun is done
   every such leftover is put down (SIGTERM, a grace, SIGKILL: process_tree.put_down), so
   none outlives the run.

Both only when ddp_lab started it (``DDP_LAB_RUN_DIR`` is set); by hand it behaves like
torchrun.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
from pathlib import Path

from ddp_lab.launch.config import RUN_DIR_VAR
from ddp_lab.launch.deadlines import LEFTOVER_GRACE_S
from ddp_lab.launch.forkserver import process_tree
from ddp_lab.launch.torchrun.failures import AgentFailure, write_agent_failures

FAILURES_FILE = "torchrun_failures.json"


def main(argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    run_dir = os.environ.get(RUN_DIR_VAR)
    orphaned = threading.Event()
    if run_dir:
        process_tree.become_subreaper()
        _watch_lifeline(orphaned)
    try:
        run(parse_args(argv))
    except ChildFailedError as err:
        if not run_dir:
            raise
        _save_failures(err, Path(run_dir))
        return 1
    finally:
        if run_dir:  # torchrun stopped its workers; what is left is their leftovers
            process_tree.put_down(process_tree.children(os.getpid()), LEFTOVER_GRACE_S)
        if orphaned.is_set():  # nobody else will remove the run folder now
            shutil.rmtree(run_dir, ignore_errors=True)
    return 0


def _watch_lifeline(orphaned: threading.Event) -> None:
    def watch() -> None:
        while os.read(0, 1024):
            pass
        orphaned.set()
        os.kill(os.getpid(), signal.SIGTERM)  # torchrun's handler stops the workers

    threading.Thread(target=watch, name="ddp_lab-lifeline", daemon=True).start()


def _save_failures(err, run_dir: Path) -> None:
    write_agent_failures(run_dir / FAILURES_FILE,
                         {rank: AgentFailure.of(f) for rank, f in err.failures.items()})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
