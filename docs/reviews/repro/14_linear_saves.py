"""Notebook 14 review: what a Linear saves for backward, by whether its input needs a gradient
(cell 6's reason for FSDP's layers - 1 backward all-gathers). Single process."""
import torch
import torch.nn as nn

layer = nn.Linear(8, 4)
for requires_grad in (False, True):
    x = torch.randn(3, 8, requires_grad=requires_grad)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (saved.append(tuple(t.shape)), t)[1],
                                                  lambda t: t):
        layer(x)
    print(f"input requires_grad={requires_grad}: saved {saved}")
# input requires_grad=False: saved [(3, 8)]
# input requires_grad=True: saved [(3, 8), (8, 4)]
