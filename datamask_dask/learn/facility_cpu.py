"""Facility location's learning step on CPU as one compiled pass over the k-NN graph (numba).

Each step of :class:`~datamask_dask.learn.metrics.Facility` reads the graph (m reference rows x
t neighbours) for every rollout: which neighbours are in U, each reference row's best and second
best similarity to U, and what each candidate would add or take away. In torch that is about ten
whole-graph tensor operations a step, each a pass through memory with a temporary of G x m x t
floats; here it is one pass per rollout, with no temporaries.

The arithmetic is the torch path's, operation for operation and in the same order (the same
float32 products, differences and clamps; the gains summed over the graph's entries in row-major
order, then each reference row's loss of its best row), so both give the same bits: the tests
compare them.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import torch

from ..compiled import on_first_use

# numba (and LLVM, ~0.1 GiB a process) is imported at the first Facility step, not with the learner
_HAS_NUMBA = importlib.util.find_spec("numba") is not None


def available(values: torch.Tensor) -> bool:
    """Whether the compiled step can run on ``values`` (a CPU graph, numba installed; else the
    torch path runs)."""
    return _HAS_NUMBA and values.device.type == "cpu" and values.dtype == torch.float32


def best_and_gains(values: torch.Tensor, neighbours: torch.Tensor, member: torch.Tensor,
                   share: torch.Tensor | None, with_gains: bool = True) -> tuple:
    """Each rollout's best similarity per reference row (G, m) and, ``with_gains``, each candidate's
    gain summed over the reference rows (G, n), not yet divided by m (else None).

    ``values`` (m, t) float32 and ``neighbours`` (m, t): the graph; ``member`` (G, n) bool: the
    rollouts' selections; ``share`` (m,) float32 or None: the reference rows' mean-1 weights.
    """
    member_np = member.contiguous().numpy()
    values_np, neighbours_np = values.contiguous().numpy(), neighbours.contiguous().numpy()
    g, n = member_np.shape
    best = np.empty((g, values_np.shape[0]), dtype=np.float32)
    gain = np.zeros((g, n), dtype=np.float32) if with_gains else np.zeros((0, 0), dtype=np.float32)
    share_np = np.zeros(0, dtype=np.float32) if share is None else share.contiguous().numpy()
    _kernel()(values_np, neighbours_np, member_np, share_np, best, gain, with_gains)
    return torch.from_numpy(best), torch.from_numpy(gain) if with_gains else None


@on_first_use
def _kernel():
    import numba

    return numba.njit(cache=True, nogil=True)(_step)


def _step(values, neighbours, member, share, best, gain, with_gains):  # pragma: no cover (compiled)
    rollouts = member.shape[0]
    m, t = values.shape
    zero = np.float32(0.0)
    weighted = share.shape[0] > 0
    owner = np.empty(m, dtype=np.int64)
    leaving = np.empty(m, dtype=np.float32)
    for g in range(rollouts):
        for i in range(m):
            # held[j] = values[i, j] * (neighbour j in U), as a float product like torch's; the best
            # (its first maximal entry, as torch's max(dim)) and the second best, the maximum with
            # the best entry set to 0 (every held value is >= 0), in one pass
            top = values[i, 0] * np.float32(member[g, neighbours[i, 0]])
            arg = 0
            second = zero
            for j in range(1, t):
                held = values[i, j] * np.float32(member[g, neighbours[i, j]])
                if held > top:
                    second, top, arg = top, held, j
                elif held > second:
                    second = held
            best[g, i] = top
            if not with_gains:
                continue
            owner[i] = neighbours[i, arg]
            leaving[i] = top - second
            if weighted:
                leaving[i] = leaving[i] * share[i]
            # joining: how much each neighbour would raise this row's best (0 for members)
            for j in range(t):
                joining = values[i, j] - top
                if joining < zero:
                    joining = zero
                if weighted:
                    joining = joining * share[i]
                gain[g, neighbours[i, j]] += joining
        if with_gains:  # after every joining term, as torch's second scatter-add
            for i in range(m):
                gain[g, owner[i]] += leaving[i]
