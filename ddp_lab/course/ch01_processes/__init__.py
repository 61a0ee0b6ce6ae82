"""Notebook 01: process groups, ranks, init methods and stores, barrier, rank-ordered printing."""
