"""02 cell 35: is gloo's receive-ready notice "one extra trip" in the ping-pong?

Plain: the notebook's `_bounce` (send then recv / recv then send). Pre-posted: each side posts
the irecv it will need next *before* it sends, so the peer always holds the notice when it
sends. If the notice cost a trip in the plain ping-pong, pre-posting would save about one
one-way time. 1-byte messages, 300 round trips each, fastest and median one-way time.
Run from the root of a checkout of 46d1faf:
flock /tmp/ddp-lab-cpu.lock .venv/bin/python docs/reviews/repro/02_notice_on_critical_path.py"""
import ddp_lab


def trips(n: int = 300, size: int = 1):
    import statistics
    import time

    import torch
    import torch.distributed as dist
    from ddp_lab.course.ch02_point_to_point.point_to_point import _bounce
    rank = dist.get_rank()
    msg = torch.zeros(size, dtype=torch.uint8)
    plain = [_bounce(rank, msg) for _ in range(n)]
    dist.barrier()
    bufs = [torch.zeros(size, dtype=torch.uint8) for _ in range(2)]
    pre = []
    peer = 1 - rank
    pending = dist.irecv(bufs[0], peer) if rank == 1 else None
    for i in range(n):
        start = time.perf_counter()
        if rank == 0:
            back = dist.irecv(bufs[1], peer)       # posted before the send
            dist.send(msg, peer)
            back.wait()
        else:
            pending.wait()
            nxt = dist.irecv(bufs[i % 2], peer) if i + 1 < n else None  # next round's, first
            dist.send(msg, peer)
            pending = nxt
        pre.append(time.perf_counter() - start)
    if rank != 0:
        return None
    one_way = lambda ts: (min(ts) / 2 * 1e6, statistics.median(ts) / 2 * 1e6)  # noqa: E731
    return {"plain": one_way(plain), "pre-posted": one_way(pre)}


for attempt in range(2):
    res = ddp_lab.run(trips, world_size=2, timeout=60, echo=False)
    for name, (best, median) in res.values[0].items():
        print(f"run {attempt}: {name:>10}: one-way best {best:6.1f} us, median {median:6.1f} us")
