"""Keep every process group a rank's code destroys until that code is done, then let go.

Why: the PyTorch DDP tutorial's ``cleanup()`` and pytorch/examples' ``multigpu_torchrun.py``
call ``dist.destroy_process_group()`` while their DDP model is still alive. That can hang
the rank for good (measured on 2 CPU cores: 4 of 15 warm runs under ddp_lab, 5 of 6 plain
torchrun runs of a script importing torch._dynamo first). The mechanism (torch 2.13):

1. ``destroy_process_group`` drops torch's own references to the group
   (torch/distributed/distributed_c10d.py:2397-2417), so DDP's Reducer, which got the group
   at construction (torch/nn/parallel/distributed.py:1437), holds the last one.
2. When the model dies, pybind11 destroys the Reducer with the GIL held (it is bound with a
   plain ``std::shared_ptr`` holder); the group goes with it and ``~ProcessGroupGloo`` joins
   gloo's worker threads, still holding the GIL.
3. A worker thread that has just finished the backward pass's last all-reduce is dropping
   that work. The work captured the thread-local state of the thread that queued it
   (``at::ThreadLocalState tls_``, torch/include/torch/csrc/distributed/c10d/
   ProcessGroupGloo.hpp:119), and during backward that state holds a Python object:
   autograd stashes a ``contextvars`` context there (torch/autograd/graph.py:976, kept in
   ``saved_objects_``, torch/include/ATen/ThreadLocalState.h:82). Releasing it takes the
   GIL (py-spy: ``~AsyncWork -> ~ThreadLocalState -> SafePyObject -> decref ->
   gil_scoped_acquire``). Main thread waits for the worker, the worker for the GIL: the
   kind of deadlock https://github.com/pytorch/pytorch/issues/56297 (open) warns about for
   pybind-bound objects whose destructors block.

It is a race: the worker only gets the GIL first if the main thread runs Python long enough
after ``backward()`` to be asked for it (the 5 ms switch interval), so it shows more or less
often depending on timing (having imported ``torch._dynamo`` before the group existed made
it frequent). Holding one more reference here means the Reducer never drops the last one;
we drop it after the rank's code returned, through the Python ``ProcessGroup`` binding,
whose destructor releases the GIL first (https://github.com/pytorch/pytorch/pull/154976),
so the worker can finish and the join returns.
"""

from __future__ import annotations

import functools
import time

_MARK = "_ddp_lab_keeps_groups"
KEEP_SECONDS = 1.0


def keep_destroyed_groups(kept: list) -> None:
    """From now on, ``destroy_process_group`` in this process puts the groups it destroys in
    ``kept`` before destroying them; call ``release(kept)`` when the rank's code is done.

    Groups destroyed over KEEP_SECONDS ago are let go at the next call: the race lasts
    milliseconds after a group's last all-reduce, so whichever object drops them last then,
    no thread of theirs still needs the GIL; and code that creates and destroys groups in a
    loop does not pile up their threads and sockets.

    Both names are replaced, ``torch.distributed.destroy_process_group`` and the one in
    ``distributed_c10d`` that it is re-exported from, so ``from torch.distributed import
    destroy_process_group`` in the user's code (as pytorch/examples does) gets it too."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    original = c10d.destroy_process_group
    if getattr(original, _MARK, False):
        original = original.__wrapped__

    @functools.wraps(original)
    def destroy_process_group(group=None):
        now = time.monotonic()
        kept[:] = [(t, g) for t, g in kept if now - t < KEEP_SECONDS]
        kept.extend((now, g) for g in _groups_destroyed_by(c10d, group))
        return original(group)

    setattr(destroy_process_group, _MARK, True)
    c10d.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group


def _groups_destroyed_by(c10d, group) -> list:
    """Every group when the default one goes (torch destroys them all then), else that one."""
    if group is None or group is c10d.GroupMember.WORLD:
        return list(c10d._world.pg_map)
    return [group] if group in c10d._world.pg_map else []


def release(kept: list) -> None:
    """Drop the kept groups: each one still referenced only from here is destroyed now,
    with the GIL released, so the threads it joins can take the GIL to finish."""
    kept.clear()
