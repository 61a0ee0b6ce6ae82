"""Exercise feedback that fits on a screen, on real ranks: a wrong answer says what is wrong
in a few lines with the first differing element, ``ex.last_failure()`` holds what those
lines leave out, and a crash shows the learner's frames, not the checker's instruments nor
torch's internals (in a real kernel too, where a frame of a cell reads "Cell In[n]")."""

from __future__ import annotations

import re

import pytest
import torch
import torch.distributed as dist

import ddp_lab.exercises as ex

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("warm_fork_server")]

SCREEN = 8  # lines a wrong answer's feedback may take
INSTRUMENTS = ("collective_trace.py", "bytes_sent.py", "_dynamo", "c10d_logger.py",
               "distributed_c10d.py", "ddp_lab/course/ch02")


def _failure(name: str, fn) -> str:
    with pytest.raises(ex.ExerciseFailed) as caught:
        ex.check(name, fn)
    return str(caught.value)


def _first_difference(message: str):
    found = re.search(r"first difference at \[([\d, ]+)\]: expected (\S+), got (\S+)",
                      message)
    assert found, message
    return tuple(int(i) for i in found[1].split(", ")), found[2], found[3]


def shift_nothing(tensor, k):
    return tensor.clone()


def shift_the_wrong_way(tensor, k):
    rank, world = dist.get_rank(), dist.get_world_size()
    if k % world == 0:
        return tensor.clone()
    received = torch.empty_like(tensor)
    for request in (dist.isend(tensor, (rank - k) % world),
                    dist.irecv(received, (rank + k) % world)):
        request.wait()
    return received


def test_returning_your_own_tensor_is_said_in_a_few_lines():
    message = _failure("02.shift", shift_nothing)
    assert len(message.splitlines()) <= SCREEN, message
    assert "you returned your own tensor, unchanged" in message and "seed" in message
    assert "tensor([" not in message
    kept = ex.last_failure()
    assert kept.name == "02.shift" and kept.message in message
    assert torch.equal(kept.got, kept.input) and not torch.equal(kept.got, kept.expected)


def test_a_wrong_answer_names_its_first_differing_element_and_keeps_both_tensors():
    message = _failure("02.shift", shift_the_wrong_way)
    assert len(message.splitlines()) <= SCREEN, message
    assert "rank - k" in message and "ex.last_failure()" in message
    index, expected, got = _first_difference(message)
    kept = ex.last_failure()
    assert isinstance(kept.expected, torch.Tensor) and kept.expected.shape == kept.got.shape
    assert f"of shape {tuple(kept.expected.shape)}" in message
    differs = torch.nonzero(kept.expected != kept.got)
    assert tuple(differs[0].tolist()) == index  # the first one, in row-major order
    for shown, tensor in ((expected, kept.expected), (got, kept.got)):
        assert float(shown) == pytest.approx(tensor[index].item(), rel=1e-6)
    counted = re.search(r"\((\d+) of (\d+) elements? differs?\)", message)
    assert counted and (int(counted[1]), int(counted[2])) == (len(differs),
                                                            kept.expected.numel()), message


def gather_with_a_bad_view(tensor):
    flat = tensor.view(-1, tensor.numel() + 1)  # torch raises, under the checker's modes
    return [flat] * dist.get_world_size()


def test_a_crash_shows_the_learners_frame_and_not_the_instruments():
    message = _failure("02.all_gather", gather_with_a_bad_view)
    assert len(message.splitlines()) <= SCREEN, message
    assert re.search(r"rank 0 raised RuntimeError: shape '\[-1, \d+\]' is invalid for input "
                     r"of size \d+$", message.splitlines()[0]), message
    assert "in gather_with_a_bad_view" in message
    assert "flat = tensor.view(-1, tensor.numel() + 1)" in message
    assert not [name for name in INSTRUMENTS if name in message], message
    hidden = re.search(r"\((\d+) frames of the course and torch hidden; "
                       r"ex\.last_failure\(\)\.traceback has them all\)", message)
    assert hidden and int(hidden[1]) >= 3, message
    whole = ex.last_failure().traceback
    assert "in gather_with_a_bad_view" in whole and "_dynamo" in whole
    assert whole.count('  File "') == int(hidden[1]) + 1


def gather_by_blocking_sends(tensor):
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    out[dist.get_rank()] = tensor.clone()
    for j in range(dist.get_world_size()):
        if j != dist.get_rank():
            dist.send(tensor, j)  # every rank sends first: nobody receives
            dist.recv(out[j], j)
    return out


@pytest.mark.slow  # a hang: the checker waits its 10 s
def test_a_hang_shows_where_the_learners_ranks_wait_once_per_line():
    message = _failure("02.all_gather", gather_by_blocking_sends)
    assert "ranks 0, 1:" in message and message.count("dist.send(tensor, j)") == 1
    assert not [name for name in INSTRUMENTS if name in message], message
    assert "distributed_c10d.py" in ex.last_failure().traceback


CELL_FN = """\
def my_all_gather(tensor):
    width = tensor.numel() + 1
    return [tensor.view(-1, width)]
"""


@pytest.mark.slow  # a kernel's start
def test_in_a_kernel_the_feedback_is_the_message_and_frames_are_cells(tmp_path):
    from kernel_helpers import execute, start_kernel
    manager, client = start_kernel(tmp_path)
    try:
        assert execute(client, CELL_FN).ok
        run = execute(client, 'import ddp_lab.exercises as ex\n'
                              'ex.check("02.all_gather", my_all_gather)')
        assert run.error["ename"] == "ExerciseFailed", run.error
        shown = "\n".join(run.error["traceback"])
        where, said = shown.splitlines()[:2]  # the check cell's line, as IPython names it
        assert where == 'Cell In[2], line 2: ex.check("02.all_gather", my_all_gather)'
        assert said.startswith("ExerciseFailed: on 1 rank (seed ")
        assert re.search(r"Cell In\[1\], line 3, in my_all_gather\n"
                         r"\s+return \[tensor\.view\(-1, width\)\]", shown), shown
        assert "exercises/__init__.py" not in shown and "driver.py" not in shown
        assert len(shown.splitlines()) <= SCREEN, shown
        kept = execute(client, "print(ex.last_failure().traceback)")
        assert kept.ok and "my_all_gather" in kept.printed and "_dynamo" in kept.printed
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def all_reduce_that_returns_its_input(tensor, local_world_size):
    return tensor.clone()


def test_a_chapter_checker_that_names_the_input_says_your_own_tensor():
    message = _failure("09.hierarchical_all_reduce", all_reduce_that_returns_its_input)
    assert "should return the sum over all ranks: you returned your own tensor" in message
    assert len(message.splitlines()) <= SCREEN, message
    kept = ex.last_failure()
    assert torch.equal(kept.got, kept.input)
