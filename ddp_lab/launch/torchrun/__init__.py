"""The torchrun path: ``run_script(..., launcher="torchrun")`` on torch's own elastic agent
(``agent``, ``session``, ``tee``), and the one runner that starts torchrun agents as
subprocesses for the course's multi-node and recovery chapters (``agents``; ``command`` is
its single-agent ``torchrun --standalone``)."""
