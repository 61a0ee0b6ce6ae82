"""Notebook 07: the Reducer's buckets, overlap, comm hooks, no_sync, memory, unused parameters."""
