"""08b flight_recorder.dump: a job with collectives on two groups (WORLD and a subgroup).

dump(folder, group) writes only ``group`` into pg_config when torch's dump has none, so
torch's analyzer meets entries of a group it has no table for.
Run: flock /tmp/ddp-lab-cpu.lock .venv/bin/python docs/reviews/repro/08b_fr_two_groups.py
"""
import tempfile

import torch
import torch.distributed as dist

import ddp_lab
from ddp_lab.course.ch08_when_it_breaks import flight_recorder


def two_groups(folder: str) -> list:
    group = dist.new_group(group_desc="training")
    t = torch.ones(10)
    dist.all_reduce(t)                 # on WORLD
    dist.all_reduce(t, group=group)    # on the subgroup
    trace = flight_recorder.dump(folder, group)
    return [(e["process_group"], e["collective_seq_id"]) for e in trace["entries"]], \
        sorted(trace["pg_config"])


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        res = ddp_lab.run(two_groups, world_size=2, args=(folder,), echo=False, timeout=60)
        print("rank 0 entries (group, seq) and pg_config keys:", res[0])
        out = flight_recorder.analyze(folder)
        print("torchfrtrace exit code", out.returncode)
        print("\n".join(out.stdout.strip().splitlines()[-6:]))
