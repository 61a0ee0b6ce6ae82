"""Wrong answers to notebook 14's exercise (FSDP's communication seconds per step): the ones
a learner really writes, and right answers that differ from the reference.

MUTANTS holds (exercise, wrong answer, a regex the rejection must match); RIGHT holds
(exercise, right-but-different answer); test_mutations.py checks every one. Data and
functions only, no test here."""

from __future__ import annotations

import math
import re

import torch


def _padded(numel, n):
    return numel + (-numel) % n


# -- right answers, written differently ------------------------------------------------------
def lists_the_collectives(layers, world_size, alpha, beta):
    """Every collective as (numel), then one sum."""
    tensors = []
    for k, (i, o) in enumerate(layers):
        tensors += [i * o, o, i * o, o]          # forward gathers, backward reduce-scatters
        if k:
            tensors.append(i * o)                # the weight again, for the input's gradient
    n = world_size
    return sum(alpha + beta * 4 * math.ceil(t / n) * (n - 1) for t in tensors)


def closed_form(layers, world_size, alpha, beta):
    """Counts and bytes summed separately, with tensors: calls x alpha + beta x bytes."""
    n = world_size
    weights = torch.tensor([_padded(i * o, n) for i, o in layers], dtype=torch.float64)
    biases = torch.tensor([_padded(o, n) for _, o in layers], dtype=torch.float64)
    calls = 5 * len(layers) - 1
    elements = 2 * weights.sum() + 2 * biases.sum() + weights[1:].sum()
    return float(calls * alpha + beta * elements * 4 * (n - 1) / n)


RIGHT = [("14.fsdp_cost", lists_the_collectives), ("14.fsdp_cost", closed_form)]


# -- wrong answers ---------------------------------------------------------------------------
def _cost(layers, n, alpha, beta, again=lambda k: k > 0, share=None, pad=True, biases=True,
          scatter_share=None):
    share = (n - 1) / n if share is None else share
    scatter = share if scatter_share is None else scatter_share
    total = 0.0
    for k, (i, o) in enumerate(layers):
        size = (lambda t: _padded(t, n)) if pad else (lambda t: t)
        gathers = [i * o] + ([o] if biases else []) + ([i * o] if again(k) else [])
        scatters = [i * o] + ([o] if biases else [])
        total += sum(alpha + beta * 4 * size(t) * share for t in gathers)
        total += sum(alpha + beta * 4 * size(t) * scatter for t in scatters)
    return total


def no_backward_gather(layers, world_size, alpha, beta):
    return _cost(layers, world_size, alpha, beta, again=lambda k: False)


def every_weight_gathered_again(layers, world_size, alpha, beta):
    return _cost(layers, world_size, alpha, beta, again=lambda k: True)


def n_instead_of_n_minus_1(layers, world_size, alpha, beta):
    return _cost(layers, world_size, alpha, beta, share=1.0)


def no_padding(layers, world_size, alpha, beta):
    return _cost(layers, world_size, alpha, beta, pad=False)


def scatter_priced_as_all_reduce(layers, world_size, alpha, beta):
    n = world_size
    return _cost(layers, n, alpha, beta, scatter_share=2 * (n - 1) / n)


def weights_only(layers, world_size, alpha, beta):
    return _cost(layers, world_size, alpha, beta, biases=False)


def textbook_three_p(layers, world_size, alpha, beta):
    """ZeRO's 3 x (n-1)/n x P bytes and one alpha per layer: the paper's accounting."""
    n = world_size
    params = sum(i * o + o for i, o in layers)
    return len(layers) * alpha + beta * 3 * params * 4 * (n - 1) / n


def returns_a_tensor(layers, world_size, alpha, beta):
    return torch.tensor(_cost(layers, world_size, alpha, beta))


MUTANTS = [
    ("14.fsdp_cost", no_backward_gather, re.escape("no all-gather in backward")),
    ("14.fsdp_cost", every_weight_gathered_again,
     re.escape("the first layer's weight is not all-gathered again")),
    ("14.fsdp_cost", n_instead_of_n_minus_1, re.escape("N - 1, not N")),
    ("14.fsdp_cost", no_padding, re.escape("count the padded size")),
    ("14.fsdp_cost", scatter_priced_as_all_reduce, re.escape("half of an all-reduce's")),
    ("14.fsdp_cost", weights_only, re.escape("the biases are parameters too")),
    ("14.fsdp_cost", textbook_three_p, re.escape("Count every all-gather and reduce-scatter")),
    ("14.fsdp_cost", returns_a_tensor, re.escape("got a tensor")),
]
