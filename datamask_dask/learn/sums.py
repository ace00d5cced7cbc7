"""Sums into indexed places that give the same bits on every run, on a GPU too.

CUDA's ``scatter_add_`` and ``index_add_`` add with atomics, in whatever order the GPU's threads
arrive: a float sum, hence a learned Facility mask, could change from one run to the next.
``index_put_(accumulate=True)`` sorts the indices first on CUDA (the kernel of torch's deterministic
mode), so its sums come out the same each time. The CPU's kernels add in order already.
"""

from __future__ import annotations

import torch
from torch import Tensor


def add_at_columns(target: Tensor, index: Tensor, values: Tensor) -> Tensor:
    """``target[g, index[g, j]] += values[g, j]`` for a 2-d ``target``, in place (``scatter_add_`` on
    dimension 1)."""
    if target.device.type != "cuda":
        return target.scatter_add_(1, index, values)
    rows = torch.arange(target.shape[0], device=target.device)[:, None].expand_as(index)
    return target.index_put_((rows, index), values, accumulate=True)


def add_at_rows(target: Tensor, index: Tensor, values: Tensor) -> Tensor:
    """``target[index[i]] += values[i]``, in place (``index_add_`` on dimension 0)."""
    if target.device.type != "cuda":
        return target.index_add_(0, index, values)
    return target.index_put_((index,), values, accumulate=True)
