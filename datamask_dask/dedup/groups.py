"""What the near-duplicate search tells each partition: the contract between dedup and the plan pass."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DuplicateGroups:
    """One partition's rows in near-duplicate groups, as positions in the partition.

    A row is set aside (``shadowed``) when a verified better row is within the threshold; its best
    such row is its ``parent``. A kept row that others stand behind is ``kept``, with the rows it
    stands for (itself included) in ``weights``.
    """

    shadowed: np.ndarray  # positions of the rows set aside, sorted
    kept: np.ndarray  # positions of the kept rows that stand for others, sorted
    weights: np.ndarray  # rows each kept row stands for, itself included
    parent: np.ndarray  # each shadowed row's parent as partition << 32 | position
    parents: np.ndarray  # positions of this partition's rows that are some row's parent
