"""The library as the learner's function found it: what it rebinds is put back, and refused.

A patch outlives the call that made it. A function that rebinds ``pickle.dumps``, a
launcher function or ``torch.distributed.barrier`` runs its own code after the seal is
closed: when the rank hands its value back, or when the checker's own code in the rank
calls the patched name. From there it could move data through the store or a file, or
forge what the rank returns. So the seal takes a snapshot of the functions, classes and
modules bound in the modules that a rank goes on using after the call (the launcher, the
checkers, torch.distributed, the picklers and I/O) and in torch's tensor and module
classes, and on closing puts back any it finds rebound or deleted (and removes a function
added to one of those classes, where it would shadow an inherited one), and refuses the
call. New names in a module are let be: importing a submodule inside the function binds one.
"""

from __future__ import annotations

import operator
import sys
import types

GUARDED_PREFIXES = ("ddp_lab.", "torch.distributed.", "torch.nn.parallel.", "cloudpickle.",
                    "torch.multiprocessing.")
GUARDED_MODULES = ("ddp_lab", "torch", "torch.distributed", "torch.nn.parallel", "cloudpickle",
                   "torch._C._distributed_c10d", "pickle", "_pickle", "copyreg", "builtins",
                   "io", "os", "posixpath", "socket", "threading", "functools")


def snapshot() -> list[tuple]:
    """For every guarded module and class: the names of the functions, classes and
    modules bound in it, and their values (C-speed: a checker may seal thousands of calls)."""
    taken = []
    for space in _guarded_spaces():
        keys, getter = _names_of(space)
        try:
            values = getter(vars(space)) if keys else None
        except KeyError:  # a name gone and another come since: the same size, new names
            _NAMES.pop(id(space))
            keys, getter = _names_of(space)
            values = getter(vars(space)) if keys else None
        if keys:
            taken.append((space, keys, getter, values, len(vars(space))))
    return taken


def put_back(taken: list) -> list[str]:
    """Rebind what changed since ``taken``; the names, as ``module.name``. Identity only:
    nothing of a value's own (its ``__eq__``) runs."""
    changed = []
    for space, keys, getter, values, size in taken:
        names = vars(space)
        if isinstance(space, type) and len(names) > size:
            changed += _remove_added(space, keys)
        try:
            if all(map(operator.is_, getter(names), values)):
                continue
        except KeyError:  # a name deleted
            pass
        for name, value in zip(keys, values):
            if names.get(name, _MISSING) is not value:
                setattr(space, name, value)
                changed.append(f"{getattr(space, '__name__', space)}.{name}")
    return changed


def _remove_added(cls: type, keys: tuple[str, ...]) -> list[str]:
    """On a class a new name shadows an inherited one (``torch.Tensor.clone`` is
    ``TensorBase``'s): what was not there is removed."""
    added = [name for name, value in list(vars(cls).items())
             if name not in keys and _guarded_value(value)]
    for name in added:
        delattr(cls, name)
    return [f"{cls.__name__}.{name}" for name in added]


_MISSING = object()
_GUARDED_TYPES = (types.FunctionType, types.BuiltinFunctionType, type, types.ModuleType,
                  types.MethodType)
_NAMES: dict[int, tuple] = {}  # id(space) -> (space, its size, names, getter)
_SPACES: list = [0, []]  # len(sys.modules) when listed, the spaces


def _names_of(space) -> tuple[tuple[str, ...], object]:
    """The guarded names of ``space`` and a getter of their values, kept while the space's
    size stays the same (a rebinding keeps it; put_back compares the values)."""
    names = vars(space)
    known = _NAMES.get(id(space))
    if known is None or known[0] is not space or known[1] != len(names):
        keys = tuple(name for name, value in list(names.items()) if _guarded_value(value))
        getter = operator.itemgetter(*keys) if len(keys) > 1 else \
            (lambda found, key=keys[0] if keys else None: (found[key],))
        known = _NAMES[id(space)] = (space, len(names), keys, getter)
    return known[2], known[3]


def _guarded_value(value) -> bool:
    # type(), not isinstance(): an object's own __class__ may warn (torch's reduce_op does)
    return issubclass(type(value), _GUARDED_TYPES)


def _guarded_spaces() -> list:
    if _SPACES[0] != len(sys.modules):
        spaces = [module for name, module in list(sys.modules.items())
                  if module is not None and (name in GUARDED_MODULES
                                             or name.startswith(GUARDED_PREFIXES))]
        torch = sys.modules.get("torch")
        if torch is not None:
            spaces += [torch.Tensor, torch.nn.Module, torch.nn.Parameter]
        _SPACES[:] = [len(sys.modules), spaces]
    return _SPACES[1]
