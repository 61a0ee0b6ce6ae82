"""Notebook 11b review: how many micro-batches' activations a ZBV rank holds, counted
(a) as the notebook does, F to I (`pipelining.peak_in_flight`), and (b) F to W: after I,
torch keeps `backward_state[chunk] = (input_values, param_groups, stage_output, output_grads)`
until `backward_weight_one_chunk` pops it (T/distributed/pipelining/stage.py:1031-1036,
1078-1083), and `stage_backward_input` ran autograd.grad with retain_graph=True
(T/distributed/pipelining/_backward.py:240-246), so the activations the weight gradients
need stay alive until W. torch's own ZBV plan (replay.torch_zbv_orders), no process group.
Run: PYTHONPATH=<tree> python docs/reviews/repro/11b_zbv_held_until_w.py"""
from ddp_lab.course.ch11_meshes import pipelining, replay

for p, m in ((4, 8), (4, 16), (8, 16)):
    orders = replay.torch_zbv_orders(p, m)
    until_i = [pipelining.peak_in_flight(o) for o in orders]
    until_w = []
    for o in orders:
        held = peak = 0
        for label in pipelining.order(o["spans"]):
            held += 1 if label[0] == "F" else -1 if label[0] in "BW" else 0
            peak = max(peak, held)
        until_w.append(peak)
    print(f"ZBV p={p} m={m}: half-stage micro-batches held, F..I {until_i}, F..W {until_w} "
          f"(1F1B's rank-0 peak in half stages: 2p = {2 * p})")
