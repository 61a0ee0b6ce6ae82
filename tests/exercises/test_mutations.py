"""Every exercise's checker against plausible wrong answers (each must be rejected with a
message that points at the mistake) and against its reference solution (accepted).

The wrong answers are the ones a learner really writes: a closed form, a sleep for a
barrier, the switched-off built-in, an off-by-one rank, the wrong chunk, no average, no
broadcast, an all-reduce after backward. The checkers draw a fresh seed each time, so these
tests also show that a mistake is caught whatever seed they draw.
"""

from __future__ import annotations

import math
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from torch.utils.data import DataLoader, DistributedSampler

import ddp_lab
import ddp_lab.exercises as ex
from ddp_lab import scratch
from ddp_lab.exercises import ch02_point_to_point as ch02
from ddp_lab.exercises import ch04_allreduce as ch04
from ddp_lab.exercises import ch05_ddp_basics as ch05

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module", autouse=True)
def warm_fork_server():
    """DDP's constructor imports torch._dynamo; the fork server imports it once it has been
    idle a moment after its first run (launch/zygote.py). Wait for that here, once, so each
    DDP check below starts in a fraction of a second, as it does in a notebook."""
    ddp_lab.run(_nothing, 1, echo=False)
    time.sleep(1.0)
    ddp_lab.run(_nothing, 1, echo=False)  # served once the deferred import is done


def _nothing():
    return None


# -- 00 --------------------------------------------------------------------------------------
def closed_form(value):
    return float((dist.get_world_size() - 1) ** 2)


def own_value(value):
    return value


def summed(value):
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item()


# -- 01 --------------------------------------------------------------------------------------
def sleeping_barrier(store, world_size, name):
    time.sleep(1)


def leaky_barrier(store, world_size, name):
    store.add(f"{name}/count", 1)


def same_keys_every_time(store, world_size, name):
    if store.add("count", 1) == world_size:
        store.set("go", "1")
    store.wait(["go"])


def opened_one_too_early(store, world_size, name):
    if store.add(f"{name}/count", 1) >= world_size - 1:
        store.set(f"{name}/go", "1")
    store.wait([f"{name}/go"])


def plain_print(line):
    print(line)


def sleep_then_print(line):
    time.sleep(0.2 * dist.get_rank())
    print(line)


def reversed_turns(line):
    for turn in reversed(range(dist.get_world_size())):
        if turn == dist.get_rank():
            print(line, flush=True)
        dist.barrier()


# -- 02 --------------------------------------------------------------------------------------
def builtin_all_gather(tensor):
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(out, tensor)
    return out


def my_own_everywhere(tensor):
    return [tensor.clone() for _ in range(dist.get_world_size())]


def ring_off_by_one(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    gathered = [torch.empty_like(tensor) for _ in range(world)]
    gathered[rank] = tensor.clone()
    for step in range(world - 1):
        outgoing = gathered[(rank - step) % world]
        incoming = gathered[(rank + step + 1) % world]  # should be (rank - step - 1)
        for request in (dist.isend(outgoing, (rank + 1) % world),
                        dist.irecv(incoming, (rank - 1) % world)):
            request.wait()
    return gathered


def shift_the_wrong_way(tensor, k):
    return ch02.shift(tensor, -k)


def shift_nothing(tensor, k):
    return tensor.clone()


def shift_by_broadcast(tensor, k):
    return builtin_all_gather(tensor)[(dist.get_rank() - k) % dist.get_world_size()]


# -- 03 --------------------------------------------------------------------------------------
def chunks_unchanged(chunks):
    return list(chunks)


def builtin_all_to_all(chunks):
    out = [torch.empty_like(c) for c in chunks]
    dist.all_to_all(out, list(chunks))
    return out


def scatters_in_reverse(chunks):
    from ddp_lab.exercises.ch03_collectives import all_to_all_by_scatter
    return all_to_all_by_scatter(chunks)[::-1]


# -- 04 --------------------------------------------------------------------------------------
def whole_tensor_to_everyone(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    total = tensor.clone()
    for peer in range(world):
        if peer != rank:
            incoming = torch.empty_like(tensor)
            for request in (dist.isend(tensor, peer), dist.irecv(incoming, peer)):
                request.wait()
            total += incoming
    return total.chunk(world)[rank]


def builtin_reduce(tensor):
    total = tensor.clone()
    dist.all_reduce(total)
    return total.chunk(dist.get_world_size())[dist.get_rank()]


def ring_wrong_chunk(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = [c.clone() for c in tensor.chunk(world)]
    for step in range(world - 1):  # unshifted: rank r ends with chunk r + 1
        outgoing, into = chunks[(rank - step) % world], chunks[(rank - step - 1) % world]
        incoming = torch.empty_like(into)
        for request in (dist.isend(outgoing, (rank + 1) % world),
                        dist.irecv(incoming, (rank - 1) % world)):
            request.wait()
        into += incoming
    return chunks[rank]


def root_sends_to_all(tensor, src):
    rank, data = dist.get_rank(), tensor.clone()
    if rank == src:
        for peer in range(dist.get_world_size()):
            if peer != src:
                dist.send(data, peer)
    else:
        dist.recv(data, src)
    return data


def chain(tensor, src):
    rank, world = dist.get_rank(), dist.get_world_size()
    data = tensor.clone()
    if (rank - src) % world:
        dist.recv(data, (rank - 1) % world)
    if (rank - src) % world < world - 1:
        dist.send(data, (rank + 1) % world)
    return data


def builtin_broadcast(tensor, src):
    data = tensor.clone()
    dist.broadcast(data, src)
    return data


def tree_rooted_at_zero(tensor, src):
    return ch04.tree_broadcast(tensor, 0)


# -- 05 --------------------------------------------------------------------------------------
def padded_sampler(model, dataset):
    counts = torch.zeros(2)
    with torch.no_grad():
        for x, y in DataLoader(dataset, batch_size=4,
                               sampler=DistributedSampler(dataset, shuffle=False)):
            counts += torch.tensor([(model(x).argmax(dim=1) == y).sum().item(), len(y)])
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


def own_shard_accuracy(model, dataset):
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = dataset[list(range(rank, len(dataset), world))]
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


def mean_of_accuracies(model, dataset):
    t = torch.tensor([own_shard_accuracy(model, dataset)])
    dist.all_reduce(t)
    return (t / dist.get_world_size()).item()


def everything_everywhere(model, dataset):
    x, y = dataset.tensors
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


def builtin_sampler(n, epoch, seed):
    sampler = DistributedSampler(range(n), shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def epoch_forgotten(n, epoch, seed):
    return ch05.sampler_shard(n, 0, seed)


def contiguous_blocks(n, epoch, seed):
    rank, world = dist.get_rank(), dist.get_world_size()
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    per = math.ceil(n / world)
    return (order * 2)[rank * per:(rank + 1) * per]


def no_padding(n, epoch, seed):
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    return order[dist.get_rank()::dist.get_world_size()]


# -- 06 --------------------------------------------------------------------------------------
def constant_rate(samples, seconds):
    return 200.0


def own_rate(samples, seconds):
    return samples / seconds


def mean_rate(samples, seconds):
    t = torch.tensor([samples / seconds])
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def sum_over_mean_time(samples, seconds):
    t = torch.tensor([float(samples), float(seconds)], dtype=torch.float64)
    dist.all_reduce(t)
    return (t[0] / (t[1] / dist.get_world_size())).item()


# -- 07 --------------------------------------------------------------------------------------
def _averaged(buffer):
    return dist.all_reduce(buffer, async_op=True).get_future().then(lambda f: f.value()[0])


def summing_hook(state, bucket):
    state["bytes"] += bucket.buffer().numel() * bucket.buffer().element_size()
    return _averaged(bucket.buffer())


def uncounted_hook(state, bucket):
    return _averaged(bucket.buffer().div_(dist.get_world_size()))


def counting_elements_hook(state, bucket):
    state["bytes"] += bucket.buffer().numel()
    return _averaged(bucket.buffer().div_(dist.get_world_size()))


def local_hook(state, bucket):
    state["bytes"] += bucket.buffer().numel() * bucket.buffer().element_size()
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


# -- 08 --------------------------------------------------------------------------------------
def plain_loop(ddp_model, optimizer, batches):
    for x, y in batches:
        optimizer.zero_grad()
        F.mse_loss(ddp_model(x), y).backward()
        optimizer.step()


def agreed_on_max(ddp_model, optimizer, batches):
    steps = torch.tensor(len(batches))
    dist.all_reduce(steps, op=dist.ReduceOp.MAX)
    plain_loop(ddp_model, optimizer, batches[:int(steps)])


def joined(ddp_model, optimizer, batches):
    with Join([ddp_model]):
        plain_loop(ddp_model, optimizer, batches)


def one_step_short(ddp_model, optimizer, batches):
    steps = torch.tensor(len(batches))
    dist.all_reduce(steps, op=dist.ReduceOp.MIN)
    plain_loop(ddp_model, optimizer, batches[:int(steps) - 1])


# -- 09 --------------------------------------------------------------------------------------
def everyone_sum(value, local_world_size):
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item()


def rank_sum_closed_form(value, local_world_size):
    node = dist.get_rank() // local_world_size
    return float(sum(range(node * local_world_size, (node + 1) * local_world_size)))


def strided_nodes(value, local_world_size):
    world = dist.get_world_size()
    nodes = world // local_world_size
    groups = [dist.new_group(list(range(g, world, nodes))) for g in range(nodes)]
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t, group=groups[dist.get_rank() % nodes])
    return t.item()


def flat_all_reduce(tensor, local_world_size):
    out = tensor.clone()
    dist.all_reduce(out)
    return out


def node_only(tensor, local_world_size):
    world, rank = dist.get_world_size(), dist.get_rank()
    groups = [dist.new_group(list(range(f, f + local_world_size)))
              for f in range(0, world, local_world_size)]
    out = tensor.clone()
    dist.all_reduce(out, group=groups[rank // local_world_size])
    return out


def all_ranks_in_one_group(tensor, local_world_size):
    group = dist.new_group(list(range(dist.get_world_size())))
    out = tensor.clone()
    dist.all_reduce(out, group=group)
    return out


def leaders_never_broadcast(tensor, local_world_size):
    world, rank = dist.get_world_size(), dist.get_rank()
    nodes = [dist.new_group(list(range(f, f + local_world_size)))
             for f in range(0, world, local_world_size)]
    leaders = dist.new_group(list(range(0, world, local_world_size)))
    leader, out = rank - rank % local_world_size, tensor.clone()
    dist.reduce(out, dst=leader, group=nodes[rank // local_world_size])
    if rank == leader:
        dist.all_reduce(out, group=leaders)
    return out


# -- 07b: the capstone -----------------------------------------------------------------------
class AllReduceAfterBackward(torch.nn.Module):
    def __init__(self, module, bucket_mb=None):
        super().__init__()
        self.module = module
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor.data, 0)

    def forward(self, *args):
        return self.module(*args)

    def sync_gradients(self):
        for p in self.module.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()


class NoBroadcast(scratch.DDP):
    def __init__(self, module, bucket_mb=None):
        real = dist.broadcast
        dist.broadcast = lambda *args, **kwargs: None
        try:
            super().__init__(module, bucket_mb)
        finally:
            dist.broadcast = real


class NoAverage(scratch.DDP):
    def __init__(self, module, bucket_mb=None):
        super().__init__(module, bucket_mb)
        self.world = 1


class BucketsIgnored(scratch.DDP):
    def __init__(self, module, bucket_mb=None):
        super().__init__(module, None)


MUTATIONS = [
    ("00.max_over_ranks", closed_form, "expected the largest"),
    ("00.max_over_ranks", own_value, "expected the largest"),
    ("00.max_over_ranks", summed, "ReduceOp.MAX"),
    ("01.store_barrier", sleeping_barrier, "time.sleep is switched off"),
    ("01.store_barrier", leaky_barrier, "held back on purpose"),
    ("01.store_barrier", same_keys_every_time, "keys of its own"),
    ("01.store_barrier", opened_one_too_early, "left before rank"),
    ("01.rank_ordered_print", plain_print, "came out as"),
    ("01.rank_ordered_print", sleep_then_print, "time.sleep is switched off"),
    ("01.rank_ordered_print", reversed_turns, "only after every lower rank"),
    ("02.all_gather", builtin_all_gather, "dist.all_gather is switched off"),
    ("02.all_gather", my_own_everywhere, r"item \[1\] should be rank 1's tensor"),
    ("02.all_gather", ring_off_by_one, "should be rank"),
    ("02.shift", shift_the_wrong_way, "k places|rank - k"),
    ("02.shift", shift_nothing, "rank - k"),
    ("02.shift", shift_by_broadcast, "switched off"),
    ("03.all_to_all", chunks_unchanged, "what rank 1 sent to rank 0"),
    ("03.all_to_all", builtin_all_to_all, "dist.all_to_all is switched off"),
    ("03.all_to_all", scatters_in_reverse, "should be chunk"),
    ("04.reduce_scatter", whole_tensor_to_everyone, "the ring sends"),
    ("04.reduce_scatter", builtin_reduce, "dist.all_reduce is switched off"),
    ("04.reduce_scatter", ring_wrong_chunk, "summed over all ranks"),
    ("04.tree_broadcast", root_sends_to_all, r"took 3 rounds .*ceil\(log2 4\) = 2"),
    ("04.tree_broadcast", chain, "took 3 rounds"),
    ("04.tree_broadcast", builtin_broadcast, "dist.broadcast is switched off"),
    ("04.tree_broadcast", tree_rooted_at_zero, "should return rank"),
    ("05b.global_accuracy", padded_sampler, "pads the shards with repeated samples"),
    ("05b.global_accuracy", own_shard_accuracy, "same global fraction"),
    ("05b.global_accuracy", mean_of_accuracies, "divide once"),
    ("05b.global_accuracy", everything_everywhere, "evaluated the whole data set"),
    ("05b.sampler_shard", builtin_sampler, "DistributedSampler is switched off"),
    ("05b.sampler_shard", epoch_forgotten, "seed \\+ epoch"),
    ("05b.sampler_shard", contiguous_blocks, r"\[rank::world_size\]"),
    ("05b.sampler_shard", no_padding, "DistributedSampler's shard"),
    ("06.global_throughput", constant_rate, "slowest rank's time"),
    ("06.global_throughput", own_rate, "slowest rank's time"),
    ("06.global_throughput", mean_rate, "average of the ranks' rates"),
    ("06.global_throughput", sum_over_mean_time, "MAX"),
    ("07.counting_hook", summing_hook, "2x too large"),
    ("07.counting_hook", uncounted_hook, "never increased"),
    ("07.counting_hook", counting_elements_hook, "element_size"),
    ("07.counting_hook", local_hook, "kept its own gradient"),
    ("07b.your_own_ddp", AllReduceAfterBackward, "after backward had ended"),
    ("07b.your_own_ddp", NoBroadcast, "right after construction"),
    ("07b.your_own_ddp", NoAverage, "divide by the world size"),
    ("07b.your_own_ddp", BucketsIgnored, "one per bucket"),
    ("08.stop_together", plain_loop, "agree on that number"),
    ("08.stop_together", agreed_on_max, "agree on that number"),
    ("08.stop_together", joined, "Join is switched off"),
    ("08.stop_together", one_step_short, "exactly min"),
    ("09.node_sum", everyone_sum, "default group"),
    ("09.node_sum", rank_sum_closed_form, "its node's sum"),
    ("09.node_sum", strided_nodes, "its node's sum"),
    ("09.hierarchical_all_reduce", flat_all_reduce, "default group"),
    ("09.hierarchical_all_reduce", node_only, "sum over all ranks"),
    ("09.hierarchical_all_reduce", all_ranks_in_one_group, "spans nodes"),
    ("09.hierarchical_all_reduce", leaders_never_broadcast, "sum over all ranks"),
]


@pytest.mark.parametrize("name, wrong, phrase", MUTATIONS,
                         ids=[f"{n}-{w.__name__}" for n, w, _ in MUTATIONS])
def test_a_wrong_answer_is_rejected_with_a_helpful_message(name, wrong, phrase):
    with pytest.raises(ex.ExerciseFailed, match=phrase):
        ex.check(name, wrong)


@pytest.mark.parametrize("name", ex.names())
def test_the_reference_solution_passes(name):
    assert ex.check(name, ex.solution(name)).startswith(f"{name}: passed.")


def test_every_exercise_has_three_wrong_answers_here():
    """Here or in the two other mutation files (pytest puts this folder on sys.path)."""
    import test_ch10_ch11_mutations
    import test_mutations_more
    named = [n for n, _, _ in MUTATIONS + test_mutations_more.MUTATIONS] + [
        n for n, wrong in test_ch10_ch11_mutations.WRONG.items() for _ in wrong]
    counts = {name: named.count(name) for name in ex.names()}
    assert all(count >= 3 for count in counts.values()), counts
    assert len(counts) >= 15, sorted(counts)


def test_a_not_implemented_error_on_a_rank_means_not_solved_yet():
    def half_done(value):
        if dist.get_rank() == 0:
            return value
        raise NotImplementedError("the other ranks")

    assert ex.NOT_SOLVED in ex.check("00.max_over_ranks", half_done)
