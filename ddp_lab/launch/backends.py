"""Which process-group backend a run gets, and what a backend string means per device.

``backend="auto"`` must let the same cell move CPU tensors (most of the course) and CUDA
tensors. NCCL alone refuses CPU tensors, so where every rank has a GPU of its own "auto" is
one default group with a backend per device type, ``"cpu:gloo,cuda:nccl"``; anywhere else
it is plain ``"gloo"`` (two ranks cannot share one GPU under NCCL, and gloo also moves CUDA
tensors for broadcast, all_reduce and a few more, through host memory).

How such a group behaves, read in torch 2.13's ``torch/distributed/distributed_c10d.py``:

- ``BackendConfig`` parses the string into {"cpu": gloo, "cuda": nccl}; the group holds one
  gloo and one NCCL backend and ``ProcessGroup`` dispatches each collective on the device of
  its tensors: CPU tensors to gloo, CUDA tensors to NCCL.
- ``dist.get_backend()`` returns the string itself, ``"cpu:gloo,cuda:nccl"``, not
  ``"nccl"``: code that asks "does this group use NCCL?" must ask ``uses_nccl(...)``, and
  ``monitored_barrier``, which checks ``get_backend(group) == "gloo"``, refuses the group
  (give it ``dist.new_group(backend="gloo")``).
  (``ProcessGroup.name()``, and so DDP's logged ``backend_name``, says "nccl": the group's
  default backend is NCCL whenever NCCL is among its backends.)
- Object collectives (``all_gather_object``, ``broadcast_object_list``, ...) pickle on the
  CPU and go through gloo: ``_get_object_coll_device`` picks "cpu" when the group has it.
- ``barrier()`` allocates its tensor on that same device, so it runs on gloo, unless it gets
  ``device_ids=[...]`` or the group was created with ``device_id=`` (then NCCL). The ranks
  do not pass ``device_id``: NCCL then creates its communicator lazily, at the first
  collective on a CUDA tensor, and a CPU-only function never starts one.
- ``new_group()`` without ``backend=`` inherits the same pair.
"""

from __future__ import annotations

AUTO = "auto"
GPU_AND_CPU = "cpu:gloo,cuda:nccl"  # "auto" where every rank has a GPU of its own
NAMES = ("gloo", "nccl")
# The device:backend pairs a run accepts: gloo moves CPU and CUDA tensors, NCCL only CUDA.
PAIRS = (("cpu", "gloo"), ("cuda", "gloo"), ("cuda", "nccl"))
# What a plain name serves (torch's Backend.backend_capability; "mpi", "ucc": both devices).
CAPABILITY = {"nccl": ("cuda",)}


def device_backends(backend: str) -> dict[str, str]:
    """{device type: backend name} as torch reads ``backend`` ("gloo" serves "cpu" and "cuda",
    "nccl" only "cuda", "cpu:gloo,cuda:nccl" what it says). Malformed: ValueError."""
    backend = str(backend).lower()
    if ":" not in backend:
        return dict.fromkeys(CAPABILITY.get(backend, ("cpu", "cuda")), backend)
    pairs = [part.split(":") for part in backend.split(",")]
    if any(len(pair) != 2 for pair in pairs) or len({d for d, _ in pairs}) != len(pairs):
        raise ValueError(f"{backend!r} is not a 'device:backend,device:backend' string")
    return dict(pairs)


def cuda_backend(backend: str) -> str | None:
    """The backend that moves CUDA tensors in a group created with ``backend`` (the string
    ``dist.get_backend()`` returns), or None if none does."""
    return device_backends(backend).get("cuda")


def uses_nccl(backend: str) -> bool:
    """True when CUDA tensors go through NCCL: every rank then needs a GPU of its own, set
    with ``torch.cuda.set_device(LOCAL_RANK)`` before its first CUDA tensor."""
    return cuda_backend(backend) == "nccl"


def is_known(backend) -> bool:
    """"auto", "gloo", "nccl", or device:backend pairs of those, each device at most once."""
    if not isinstance(backend, str):
        return False
    if backend in (AUTO, *NAMES):
        return True
    try:
        pairs = device_backends(backend).items()
    except ValueError:
        return False
    return ":" in backend and backend == backend.strip().lower() and all(
        pair in PAIRS for pair in pairs)


def auto_backend(world_size: int, gpu_count: int, nccl_available: bool) -> str:
    """What "auto" means for ``world_size`` ranks on a machine with ``gpu_count`` GPUs."""
    if nccl_available and 0 < world_size <= gpu_count:
        return GPU_AND_CPU
    return "gloo"


def resolve_backend(backend: str, world_size: int, gpu_count: int,
                    nccl_available: bool) -> str:
    """The string the ranks pass to ``init_process_group``: "auto" resolved, else as given."""
    if backend != AUTO:
        return backend
    return auto_backend(world_size, gpu_count, nccl_available)


def machine_backend(local_world_size: int) -> str:
    """"auto" on this machine, for a script that initializes its own group (under torchrun
    or ``run_script``): ``local_world_size`` ranks share this machine's GPUs."""
    import torch.distributed as dist
    return auto_backend(local_world_size, gpu_count(), dist.is_nccl_available())


def gpu_count() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
