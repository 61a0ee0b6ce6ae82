"""Notebook 09: torchrun, elastic_launch and a two-node cluster in network namespaces."""
