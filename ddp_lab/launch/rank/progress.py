"""``ddp_lab.progress(iterable)``: one progress bar for the whole run, not one per rank.

Every rank iterates in lockstep in data-parallel code, so N bars would say the same thing N
times and fight over the same lines. The bar is drawn by rank 0 only (tqdm), on stderr,
which the launcher turns into an in-place display in a notebook and into a line every few
seconds in a terminal. Under torchrun it behaves the same; outside any run it is plain tqdm.
"""

from __future__ import annotations

import os
import sys


def progress(iterable=None, **tqdm_kwargs):
    """tqdm on rank 0, silent elsewhere; accepts tqdm's keyword arguments."""
    if "RANK" not in os.environ:
        from tqdm.auto import tqdm
        return tqdm(iterable, **tqdm_kwargs)
    from tqdm import tqdm  # a rank's stderr is a pipe: a plain text bar of fixed width
    settings = {"disable": os.environ["RANK"] != "0", "file": sys.stderr, "ncols": 80,
                "mininterval": 0.5, **tqdm_kwargs}
    return tqdm(iterable, **settings)
