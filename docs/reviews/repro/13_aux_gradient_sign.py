"""Notebook 13 review, cell 16: which way does the Switch aux loss push each expert's router
logit? scratch.moe.switch_aux_loss on one process, a router that favours expert 0; the
gradient of the aux loss with respect to the logits, summed over tokens. Descent moves a
logit against its gradient: positive = pushed down, negative = pushed up.
Run: PYTHONPATH=<tree> python docs/reviews/repro/13_aux_gradient_sign.py"""
import torch
from ddp_lab.scratch.moe import switch_aux_loss

torch.manual_seed(0)
tokens, n, k = 64, 4, 1
logits = (torch.randn(tokens, n) + torch.tensor([3.0, 1.0, 0.0, -1.0])).requires_grad_()
probs = logits.softmax(-1)
expert_of = probs.topk(k, dim=-1).indices
requested = torch.bincount(expert_of.reshape(-1), minlength=n)
aux = switch_aux_loss(probs, requested, k)
aux.backward()
f = requested.float() / (tokens * k)
P = probs.mean(0).detach()
print("load f_e            ", [round(x, 3) for x in f.tolist()])
print("mean prob P_e       ", [round(x, 3) for x in P.tolist()])
print("dAux/dP_e = n f_e   ", [round(x, 3) for x in (n * f).tolist()])
print("dAux/dlogit_e (sum) ", [round(x, 4) for x in logits.grad.sum(0).tolist()])
print("experts pushed UP by descent (negative gradient):",
      [e for e, g in enumerate(logits.grad.sum(0).tolist()) if g < 0])
