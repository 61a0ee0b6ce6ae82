"""Notebook 02's rank functions on one rank: which give an answer, which an error naming the
fix, which crash on their own code. Run from the root of a checkout of 46d1faf:
flock /tmp/ddp-lab-cpu.lock \
.venv/bin/python docs/reviews/repro/02_world_size_1.py"""
import ddp_lab
from ddp_lab.course.ch02_point_to_point import point_to_point as p2p

for name in ("recv_from_any", "nonblocking_send_recv", "ring_token", "nonblocking_exchange",
             "batched_exchange", "even_odd_exchange"):
    fn = getattr(p2p, name)
    try:
        res = ddp_lab.run(fn, world_size=1, timeout=5, echo=False)
        print(f"{name}: values {res.values}")
    except Exception as exc:  # noqa: BLE001
        tb = [l for l in (getattr(exc, "traceback", "") or str(exc)).splitlines() if l.strip()]
        print(f"{name}: {type(exc).__name__}: {tb[-1][:200] if tb else ''}")
