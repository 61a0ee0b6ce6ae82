"""05b review: "save on rank 0, load on all" needs every rank to see the file. Simulate node-local
storage: the checkpoint exists for rank 0 only (rank 1 is given a path on "its own disk", empty).
load_if_present returns None on rank 1 without a word; rank 0 resumes at step 5 with the saved
weights (after DDP's constructor broadcast, so nothing re-syncs them), rank 1 starts at step 0
from the initial ones; their collectives pair up step 5<->0 ... 9<->4, then rank 1 waits forever."""
import os, shutil, tempfile
import torch.distributed as dist
import ddp_lab
from ddp_lab.course.ch05_ddp_basics import resume


def worker(shared, local):
    path = shared if dist.get_rank() == 0 else local
    return resume.train_toy(resume.ResumeConfig(), os.path.join(path, "toy.pt"))["steps"]


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as shared, tempfile.TemporaryDirectory() as local:
        ddp_lab.run(resume.train_toy, world_size=2, echo=False,
                    args=(resume.ResumeConfig(), os.path.join(shared, "toy.pt"), 4))
        try:
            print(ddp_lab.run(worker, world_size=2, args=(shared, local), timeout=15).values)
        except Exception as err:  # WorkerError (rank 0 left early) or WorkerTimeout
            print(type(err).__name__ + ":", str(err).splitlines()[0])
