"""Notebook 08: hangs, stragglers, mismatched collectives, crashes, elastic recovery."""
