"""compare_set's return value on HashStore, FileStore and TCPStore (one process)."""
import os, socket, tempfile
from datetime import timedelta
import torch.distributed as dist

CASES = ((None, "", "mine"), (None, "x", "mine"), ("x", "x", "mine"), ("x", "z", "mine"),
         ("x", "", "mine"))  # the last: not among the notebook's cases

def fresh(kind, tmp, i):
    if kind == "hash":
        return dist.HashStore()
    if kind == "file":
        return dist.FileStore(os.path.join(tmp, f"f{i}"), 1)
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    return dist.TCPStore("127.0.0.1", port, 1, True, timedelta(seconds=10))

with tempfile.TemporaryDirectory() as tmp:
    for kind in ("hash", "file", "tcp"):
        for i, (before, exp, des) in enumerate(CASES):
            st = fresh(kind, tmp, i)
            if before is not None:
                st.set("key", before)
            ret = st.compare_set("key", exp, des).decode()
            stored = st.get("key").decode() if st.check(["key"]) else None
            print(kind, dict(before=before, expected=exp, returned=ret, stored=stored))
