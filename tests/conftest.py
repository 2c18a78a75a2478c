"""Shared test set-up: the cores split among test processes when the suite runs in several."""

from __future__ import annotations

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `pytest -n N` runs N processes; each process's torch would otherwise start as many
    # threads as there are cores, and N x cores threads contend for them.
    import torch

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
