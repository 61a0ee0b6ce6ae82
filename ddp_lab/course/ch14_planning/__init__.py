"""Notebook 14: plan a parallel run: memory and time models for DDP, ZeRO, FSDP, TP, PP and a
2-D plan, checked against real runs on a shaped link, then used on paper at cluster scale."""
