"""Notebook 14 review: bytes autograd saves for backward in the MLP of cell 2 (8 x
Linear(256, 256) + ReLU, 64 rows), distinct storages, parameters left out; with and without
torch.utils.checkpoint per pair of layers. Single process, no ranks."""
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

torch.manual_seed(0)
layers = []
for k in range(8):
    layers.append(nn.Linear(256, 256))
    if k < 7:
        layers.append(nn.ReLU())
model = nn.Sequential(*layers)
params = {p.untyped_storage().data_ptr() for p in model.parameters()}


def saved_bytes(run):
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    out.sum().backward()
    return sum(seen.values())


x = torch.randn(64, 256)
plain = saved_bytes(lambda: model(x))
pairs = [model[i:i + 4] for i in range(0, 15, 4)]   # Linear, ReLU, Linear, ReLU (last: 3 modules)


def checkpointed():
    h = x
    for block in pairs:
        h = checkpoint(block, h, use_reentrant=False)
    return h


ckpt = saved_bytes(checkpointed)
tile = 64 * 256 * 4
print(f"no checkpointing: {plain} bytes = {plain / tile:.1f} x (64 x 256 fp32)")
print(f"checkpointing per pair, outer graph: {ckpt} bytes = {ckpt / tile:.1f} x (64 x 256 fp32)")
