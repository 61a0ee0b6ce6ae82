"""Notebook 14 review: how the cluster-scale crossovers move with the HBM figure (80e9 in
paper.py; an H100 SXM 80GB reports 81559 MiB = 85.5e9 bytes in nvidia-smi) and how close to
80e9 the plans that win the last widths are."""
from ddp_lab.course.ch14_planning import paper

s = paper.sweep()
print("HBM 80e9:  ", paper.crossovers(s))
for w in (30720, 31744, 32768):
    print(w, {n: round(r["memory"] / 1e9, 1) for n, r in s[w].items() if n in ("TP8xFSDP8", "PP8xDP8")})
paper.HBM = 81559 * 2**20
print("HBM 85.5e9:", paper.crossovers(paper.sweep()))
