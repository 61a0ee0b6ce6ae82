"""The learner's function as its kernel wrote it: bytes, unpickled only where it is called.

Unpickling runs code (a payload can name any callable to rebuild itself), so the process
that checks a submission never unpickles it: it hands the checker
``sealed(LearnerFunction(payload), exercise)``. The seal pickles what it is given and
unpickles it inside the seal, in the process that calls it (a rank, usually); a
LearnerFunction pickles as "``pickle.loads`` of the payload", so what the seal unpickles
there is the learner's function (or class) itself: the seal sees its code (a reference
under another name refuses at once) and seals a class method by method, as it does for a
function that ``ex.check`` got from a notebook.
"""

from __future__ import annotations

import pickle


class LearnerFunction:
    """The payload of one exercise; calling it directly unpickles it first, each time."""

    def __init__(self, payload: bytes, exercise: str, name: str = "your function"):
        if not isinstance(payload, bytes) or not payload:
            raise ValueError(f"{exercise}: the payload must be the kernel's non-empty bytes")
        self.payload = payload
        self.exercise = exercise
        self.__name__ = name  # the seal's messages name the function as the notebook does

    def __reduce__(self):
        return pickle.loads, (self.payload,)

    def __call__(self, *args, **kwargs):
        return pickle.loads(self.payload)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<{self.__name__} for {self.exercise}: {len(self.payload)} bytes, not loaded>"
