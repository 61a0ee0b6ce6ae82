"""Notebook 04: all-reduce from send/recv (naive, ring, chunked ring, halving-doubling) and its bandwidth."""
