"""Notebook 11 review, cell 8: "changes that ... split a value locally (Replicate -> Partial)
need none" [no collective]. What does a learner's `redistribute` to Partial do in torch 2.13?
2 ranks, a Replicate DTensor redistributed to Partial().
Run: flock /tmp/ddp-lab-cpu.lock .venv/bin/python docs/reviews/repro/11_replicate_to_partial.py"""
import ddp_lab


def rank_fn():
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    t = DTensor.from_local(torch.ones(2), mesh, [Replicate()])
    try:
        p = t.redistribute(mesh, [Partial()])
        return f"ok: {p.placements}, local {p.to_local().tolist()}"
    except Exception as err:  # noqa: BLE001
        return f"{type(err).__name__}: {err}"


if __name__ == "__main__":
    for rank, v in enumerate(ddp_lab.run(rank_fn, world_size=2, echo=False).values):
        print(rank, v)
