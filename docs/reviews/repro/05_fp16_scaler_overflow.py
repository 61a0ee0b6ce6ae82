"""05 review: on the CPU, fp16 autocast and a GradScaler whose scale overflows the fp16 backward
show what the scaler is for (cells 30-32 use bf16 and an inf in the input instead)."""
import torch

torch.manual_seed(0)
m = torch.nn.Linear(10, 5)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 40)
with torch.autocast("cpu", dtype=torch.float16):
    out = m(torch.randn(4, 10) * 100)
print("forward dtype:", out.dtype)
loss = out.float().pow(2).mean()
scaler.scale(loss).backward()
print("grads finite:", [bool(torch.isfinite(p.grad).all()) for p in m.parameters()])
before = m.weight.detach().clone()
scaler.step(opt)
scaler.update()
print("stepped:", not torch.equal(before, m.weight), "; scale after:", scaler.get_scale(), "(2**39 =", 2.0 ** 39, ")")
