"""One CPU thread per task for torch's numeric kernels, so that the rows selected never depend on
the scheduler, the workers' threads or the machine's cores; and one learner at a time on a GPU.

A float sum split over more threads adds in another order (MKL's products, torch's reductions), and
one changed last bit can turn a learned top-k or a SimHash sign. Dask and Spark run tasks side by
side, one per core, so the machine stays busy.

A GPU worker's threads read, check and write partitions beside its learner, but its learners take
turns (:func:`one_learner_per_gpu`): each may then use the GPU's memory whole
(:mod:`datamask_dask.plan.memory`), and two never contend for it.
"""

from __future__ import annotations

import contextlib
import threading

import torch

_GPU_TURNS: dict[int, threading.Lock] = {}  # device index -> its turn


@contextlib.contextmanager
def one_blas_thread():
    """numpy's BLAS on one thread in this process for the block, as Dask's workers run it (their
    nannies set ``OMP_NUM_THREADS=1``): the local schedulers run a task per core, and tasks side by side
    each calling a BLAS of every core's threads contend for the cores (OpenBLAS most)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def one_cpu_thread(device: torch.device | str = "cpu"):
    """Run torch on one CPU thread for the block (:func:`torch_threads`), so that its sums add in one
    order. Nothing changes where ``device`` is not the CPU."""
    return torch_threads(1, device)


@contextlib.contextmanager
def one_learner_per_gpu(device: torch.device | str = "cpu"):
    """Hold ``device``'s turn for the block where it is a GPU: one learner at a time in this process.
    Nothing changes on the CPU, whose learners run side by side on one thread each."""
    device = torch.device(device)
    if device.type != "cuda":
        yield
        return
    index = torch.cuda.current_device() if device.index is None else device.index
    with _GPU_TURNS.setdefault(index, threading.Lock()):  # setdefault: one lock, whichever thread comes first
        yield


@contextlib.contextmanager
def torch_threads(n: int, device: torch.device | str = "cpu"):
    """Run torch on ``n`` CPU threads for the block: this thread's OpenMP and MKL counts (torch sets both
    per thread), restored after, so a caller's own count is left as it was. Nothing changes where
    ``device`` is not the CPU."""
    if torch.device(device).type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    if before != n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if before != n:
            torch.set_num_threads(before)
