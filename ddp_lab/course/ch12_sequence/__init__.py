"""Notebook 12: sequence and context parallelism. Ring attention and Ulysses from the
collectives, the online softmax, causal load balance (zig-zag), what each costs on a link
and in memory, Megatron's sequence parallelism, and a differentiable all-gather's pitfall."""
