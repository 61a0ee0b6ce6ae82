"""The library as the learner's function found it: what it rebinds is put back, and refused.

A patch outlives the call that made it. A function that rebinds ``pickle.dumps``, a
launcher function or ``torch.distributed.barrier`` runs its own code after the seal is
closed: when the rank hands its value back, or when the checker's own code in the rank
calls the patched name. From there it could move data through the store or a file, or
forge what the rank returns. So the seal takes a snapshot of the functions, classes and
modules bound in the modules that a rank goes on using after the call (the launcher, the
checkers, torch.distributed, the picklers and I/O) and in torch's tensor and module
classes, and on closing puts back any it finds rebound or deleted, and refuses the call.
New names are let be: importing a submodule inside the function binds one.
"""

from __future__ import annotations

import sys
import types

GUARDED_PREFIXES = ("ddp_lab.", "torch.distributed.", "torch.nn.parallel.", "cloudpickle.",
                    "torch.multiprocessing.")
GUARDED_MODULES = ("ddp_lab", "torch", "torch.distributed", "torch.nn.parallel", "cloudpickle",
                   "torch._C._distributed_c10d", "pickle", "_pickle", "copyreg", "builtins",
                   "io", "os", "posixpath", "socket", "threading", "functools")


def snapshot() -> list[tuple[object, list[tuple[str, object]]]]:
    """(namespace, [(name, value)]) for every function, class or module bound in the
    guarded modules and classes."""
    return [(space, [(name, value) for name, value in list(vars(space).items())
                     if _guarded_value(value)])
            for space in _guarded_spaces()]


def put_back(taken: list) -> list[str]:
    """Rebind what changed since ``taken``; the names, as ``module.name``."""
    changed = []
    for space, bound in taken:
        names = vars(space)
        for name, value in bound:
            if names.get(name, _MISSING) is not value:
                setattr(space, name, value)
                changed.append(f"{getattr(space, '__name__', space)}.{name}")
    return changed


_MISSING = object()


_GUARDED_TYPES = (types.FunctionType, types.BuiltinFunctionType, type, types.ModuleType,
                  types.MethodType)


def _guarded_value(value) -> bool:
    # type(), not isinstance(): an object's own __class__ may warn (torch's reduce_op does)
    return issubclass(type(value), _GUARDED_TYPES)


def _guarded_spaces() -> list:
    spaces = [module for name, module in list(sys.modules.items())
              if module is not None and (name in GUARDED_MODULES
                                         or name.startswith(GUARDED_PREFIXES))]
    torch = sys.modules.get("torch")
    if torch is not None:
        spaces += [torch.Tensor, torch.nn.Module, torch.nn.Parameter]
    return spaces
