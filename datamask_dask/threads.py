"""One CPU thread per task for torch's numeric kernels, so that the rows selected never depend on
the scheduler, the workers' threads or the machine's cores.

A float sum split over more threads adds in another order (MKL's products, torch's reductions), and
one changed last bit can turn a learned top-k or a SimHash sign. Dask and Spark run tasks side by
side, one per core, so the machine stays busy.
"""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def one_cpu_thread(device: torch.device | str = "cpu"):
    """Run torch on one CPU thread for the block: this thread's OpenMP and MKL counts (torch sets
    both per thread), restored after, so a caller's own thread count is left as it was. Nothing
    changes where ``device`` is not the CPU."""
    if torch.device(device).type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    if before != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if before != 1:
            torch.set_num_threads(before)
