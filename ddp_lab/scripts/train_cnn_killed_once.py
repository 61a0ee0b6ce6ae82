"""``train_cnn`` with a fault injected: one worker is SIGKILLed right after the first
checkpoint, once, the way a node lost to preemption or the OOM killer dies (no exception,
no cleanup). Everything else is ``ddp_lab.scripts.train_cnn`` unchanged.

    torchrun --standalone --nproc-per-node=2 --max-restarts=1 \\
        -m ddp_lab.scripts.train_cnn_killed_once --epochs 3 --checkpoint /tmp/ckpt.pt

torchrun then restarts the whole worker group (TORCHELASTIC_RESTART_COUNT becomes "1"),
the new workers find the checkpoint and resume from it; on that attempt nobody is killed.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

from ddp_lab.scripts import train_cnn


def kill_this_process_once_written(path: Path, poll_s: float = 0.005) -> None:
    """SIGKILL this process as soon as ``path`` exists: a watcher thread, so the training
    code knows nothing about it (checkpoints are written atomically, so existence means
    a whole epoch is on disk)."""
    def watch() -> None:
        while not path.exists():
            time.sleep(poll_s)
        print(f"rank {os.environ['RANK']}: checkpoint written, now SIGKILL myself "
              f"(pid {os.getpid()})", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="fault-injection", daemon=True).start()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, add_help=False)
    parser.add_argument("--kill-rank", type=int, default=1, help="the rank that dies")
    args, train_argv = parser.parse_known_args(argv)
    config = train_cnn.parse_args(train_argv)
    if config.checkpoint is None:
        sys.exit("--checkpoint is required: without it there is nothing to resume from")
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if first_attempt and int(os.environ["RANK"]) == args.kill_rank:
        if Path(config.checkpoint).exists():
            sys.exit(f"{config.checkpoint} exists already: start from a fresh path")
        kill_this_process_once_written(Path(config.checkpoint))
    train_cnn.main(train_argv)


if __name__ == "__main__":
    main()
