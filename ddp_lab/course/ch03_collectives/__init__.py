"""Notebook 03: every collective as pictures of real tensors, and what each costs."""
