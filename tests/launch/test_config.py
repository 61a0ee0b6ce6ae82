"""What the kernel and the ranks share: the environment a rank starts with, the run folder."""

from __future__ import annotations

from ddp_lab.launch.config import threads_per_rank


def test_threads_per_rank_never_below_one():
    assert threads_per_rank(1000) == 1
    assert threads_per_rank(1) >= 1


def test_a_run_folder_is_private_and_says_whose_it_is():
    import os
    import shutil
    import stat

    from ddp_lab.launch.config import RUN_DIR_PREFIX, new_run_dir
    folder = new_run_dir()
    try:
        assert os.path.basename(folder).startswith(f"{RUN_DIR_PREFIX}{os.getpid()}-")
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    finally:
        shutil.rmtree(folder)
