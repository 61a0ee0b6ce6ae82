"""How close the surviving replicas come to replicas.one_process (cell 7 says "exactly")."""
import ddp_lab
from ddp_lab.course.ch15_resilience import replicas

if __name__ == "__main__":
    group = ddp_lab.run(replicas.run_replica, world_size=4, echo=False, timeout=60).values
    reference = replicas.one_process(group[0]["seen"])
    for r in (0, 1, 3):
        print(f"replica {r}: largest difference to one_process",
              replicas.largest_difference(group[r]["params"], reference))
