"""Expected against returned, in a line: the one place where a checker's comparison of two
values is put into words.

A wrong answer is shown by its smallest evidence (dtype and shape, the first element that
differs with its index and both values, how many differ, "you returned your own tensor"),
never by printing both tensors: a 5 x 5 int64 tensor alone takes a dozen lines, and the
sentence that names the mistake drowns in them. The full values stay available on request
(``ex.last_failure()``, :mod:`.feedback`).
"""

from __future__ import annotations

import reprlib

import torch

# Values shown inline: a tensor of up to this many elements, a list of up to this many items.
INLINE_ELEMENTS = 6
INLINE_ITEMS = 4
RTOL, ATOL = 1e-5, 1e-6  # what exact=False forgives: float32 sums in another order


def tensor_difference(got, want: torch.Tensor, exact: bool = True, mine=None) -> str | None:
    """None if ``got`` matches ``want`` (dtype, shape, values; ``exact=False`` allows float
    rounding), else what differs, in one line. ``mine``, the rank's own input, lets the line
    say "you returned your own tensor" when that is what happened."""
    if not isinstance(got, torch.Tensor):
        return f"expected a tensor ({layout(want)}), got {short(got)}"
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"expected {layout(want)}, got {layout(got)}"
    differs = _differing(got.detach().cpu(), want.detach().cpu(), exact)
    if not bool(differs.any()):
        return None
    first = first_difference(got, want, differs)
    if _is_own(got, mine):
        return f"you returned your own tensor, unchanged ({first})"
    return first


def first_difference(got: torch.Tensor, want: torch.Tensor, differs: torch.Tensor) -> str:
    """ "int64 of shape (4, 4), first difference at [0, 1]: expected 7, got 9 (3 of 16
    elements differ)" """
    index = [int(i) for i in torch.nonzero(differs)[0]]
    at = f"[{', '.join(map(str, index))}]" if index else "(its one value)"
    count = int(differs.sum())
    return (f"{layout(want)}, first difference at {at}: expected {_element(want, index)}, "
            f"got {_element(got, index)} ({count} of {want.numel()} element"
            f"{'s' if want.numel() != 1 else ''} differ{'s' if count == 1 else ''})")


def layout(tensor: torch.Tensor) -> str:
    """ "int64 of shape (4, 4)": what a tensor is, without its values."""
    return f"{str(tensor.dtype).removeprefix('torch.')} of shape {tuple(tensor.shape)}"


def short(value) -> str:
    """A value in a few words: a small tensor with its values, a large one by its layout, a
    list by its first items; never more than a line."""
    if isinstance(value, torch.Tensor):
        if value.numel() <= INLINE_ELEMENTS:
            return f"tensor({value.detach().cpu().tolist()}) ({layout(value)})"
        return f"a tensor ({layout(value)})"
    if isinstance(value, (list, tuple)):
        items = ", ".join(short(item) for item in value[:INLINE_ITEMS])
        more = ", ..." if len(value) > INLINE_ITEMS else ""
        return f"a {type(value).__name__} of {len(value)}: [{items}{more}]"
    return _REPR.repr(value)


def _differing(got: torch.Tensor, want: torch.Tensor, exact: bool) -> torch.Tensor:
    if exact or not (want.is_floating_point() or want.is_complex()):
        return got != want
    return ~torch.isclose(got, want, rtol=RTOL, atol=ATOL)


def _element(tensor: torch.Tensor, index: list[int]):
    value = tensor.detach().cpu()[tuple(index)].item()
    if isinstance(value, float) and tensor.element_size() <= 4:
        return f"{value:.9g}"  # enough digits to tell two float32 values apart
    return repr(value)


def _is_own(got: torch.Tensor, mine) -> bool:
    return (isinstance(mine, torch.Tensor) and mine.shape == got.shape
            and mine.dtype == got.dtype and torch.equal(mine.detach().cpu(),
                                                        got.detach().cpu()))


_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict = 100, 100, INLINE_ITEMS, 4
