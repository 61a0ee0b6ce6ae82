"""Notebook 13: expert parallelism. A mixture-of-experts layer with its experts split over the
ranks (scratch.MoE), checked against one process; the router's load per expert and per
rank, capacity and dropped tokens, the load-balancing loss, the all-to-all on a slow link."""
