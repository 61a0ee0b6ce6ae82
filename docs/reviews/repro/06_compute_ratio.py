"""06 review: how much more compute is a 28x28 step (batch 64) than an 8x8 step (batch 32)?
FLOPs of forward+backward counted by torch.utils.flop_counter, and a single-process timing
of the same step (1 thread, median of 20), the no_sync compute that cell 31's assert compares."""
import statistics, time
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode
from ddp_lab.course.models import DigitsCNN

torch.set_num_threads(1)
torch.manual_seed(0)


def step(model, opt, x, y):
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


res = {}
for size, batch in ((8, 32), (28, 64)):
    model = DigitsCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.rand(batch, 1, size, size), torch.randint(0, 10, (batch,))
    with FlopCounterMode(display=False) as counter:
        step(model, opt, x, y)
    times = []
    for i in range(25):
        t = time.perf_counter(); step(model, opt, x, y); times.append(time.perf_counter() - t)
    res[size] = (counter.get_total_flops(), statistics.median(times[5:]))
    print(f"{size}x{size}, batch {batch}: {res[size][0] / 1e6:.1f} MFLOP per step, {res[size][1] * 1e3:.2f} ms")
print(f"ratio per step: FLOPs {res[28][0] / res[8][0]:.1f}x, time {res[28][1] / res[8][1]:.1f}x; "
      f"per sample FLOPs {res[28][0] / 64 / (res[8][0] / 32):.1f}x")
