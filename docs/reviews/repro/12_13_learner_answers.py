"""Review of 11b, 12 and 13: the checkers against answers a learner is likely to write.
Prints, per attempt, whether the check passed and the first line of what it said.
Run: PYTHONPATH=<tree> python docs/reviews/repro/12_13_learner_answers.py"""
import torch
import torch.distributed as dist

import ddp_lab.exercises as ex


# 11b: float32 tensors for time.time() values (the trap the hint names)
def bubble_float32(spans):
    first = torch.tensor([min(s for _, s, _ in spans)])
    last = torch.tensor([max(e for _, _, e in spans)])
    busy = torch.tensor([sum(e - s for _, s, e in spans)])
    dist.all_reduce(first, op=dist.ReduceOp.MIN)
    dist.all_reduce(last, op=dist.ReduceOp.MAX)
    dist.all_reduce(busy)
    return 1 - busy.item() / (dist.get_world_size() * (last.item() - first.item()))


# 11b: right, with all_gather_object
def bubble_objects(spans):
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, spans)
    start = min(s for sp in every for _, s, _ in sp)
    end = max(e for sp in every for _, _, e in sp)
    busy = sum(e - s for sp in every for _, s, e in sp)
    return 1 - busy / (len(every) * (end - start))


# 12: the step without rescaling acc
def step_no_acc_rescale(acc, m, l, scores, v):
    m_new = torch.maximum(m, scores.amax(-1))
    p = torch.exp(scores - m_new.unsqueeze(-1))
    c = torch.exp(m - m_new)
    return acc + p @ v, m_new, l * c + p.sum(-1)


# 12: the recipe (no -inf guard)
def step_recipe(acc, m, l, scores, v):
    m_new = torch.maximum(m, scores.amax(-1))
    p = torch.exp(scores - m_new.unsqueeze(-1))
    c = torch.exp(m - m_new)
    return acc * c.unsqueeze(-1) + p @ v, m_new, l * c + p.sum(-1)


# 13: counts exchanged with all_gather, rows with all_to_all (a list of blocks)
def dispatch_lists(rows, counts):
    world = dist.get_world_size()
    every = [torch.empty_like(counts) for _ in range(world)]
    dist.all_gather(every, counts)
    me = dist.get_rank()
    got = torch.stack([c[me] for c in every])
    sends = list(rows.split(counts.sum(1).tolist()))
    recvs = [rows.new_empty((int(n), rows.shape[1])) for n in got.sum(1).tolist()]
    dist.all_to_all(recvs, sends)
    return torch.cat(recvs), got


ATTEMPTS = [("11b.interleaved_bubble", "float32 tensors", bubble_float32),
            ("11b.interleaved_bubble", "all_gather_object", bubble_objects),
            ("12.online_softmax", "acc not rescaled", step_no_acc_rescale),
            ("12.online_softmax", "the recipe, no -inf guard", step_recipe),
            ("13.dispatch", "all_gather counts + all_to_all lists", dispatch_lists)]

if __name__ == "__main__":
    for name, what, fn in ATTEMPTS:
        try:
            said = ex.check(name, fn)
            print(f"{name} [{what}]: PASSED: {str(said).splitlines()[0][:200]}")
        except Exception as e:  # noqa: BLE001
            print(f"{name} [{what}]: {type(e).__name__}: {str(e).strip().splitlines()[0][:300]}")
