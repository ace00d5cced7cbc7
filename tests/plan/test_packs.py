"""Packs: which consecutive partitions' cells are learned as one (pure planning)."""

from __future__ import annotations

from datamask_dask.plan.reduce import pack_cells
from datamask_dask.plan.types import Cell, Pack


def _cells(*eligible, quota=1, group=0, budget=None) -> dict:
    """One cell of ``group`` per partition with these eligible counts (None: the partition has none)."""
    return {p: (Cell(None, group, e, quota if e else 0, budget),) for p, e in enumerate(eligible)
            if e is not None}


def test_consecutive_partitions_pack_while_their_eligible_rows_fit_one_chunk():
    packs = pack_cells(_cells(40, 30, 30, 50, 60), max_rows=100)
    assert [p.partitions for p in packs] == [(0, 1, 2)]  # 3 + 4 would be 110 rows, 4 is then alone
    assert packs[0] == Pack(None, 0, (0, 1, 2), 3, None)


def test_a_cell_larger_than_a_chunk_is_learned_alone_and_ends_the_run():
    packs = pack_cells(_cells(10, 20, 500, 30, 40), max_rows=100)
    assert [p.partitions for p in packs] == [(0, 1), (3, 4)]


def test_partitions_without_eligible_rows_do_not_break_a_run():
    packs = pack_cells(_cells(10, 0, None, 20), max_rows=100)
    assert [p.partitions for p in packs] == [(0, 3)]


def test_nothing_to_select_or_a_single_cell_is_no_pack():
    assert pack_cells(_cells(10, 20, quota=0), max_rows=100) == ()
    assert pack_cells(_cells(10), max_rows=100) == ()
    tokens = pack_cells(_cells(10, 20, budget=0, quota=0), max_rows=100)
    assert tokens == ()
    assert pack_cells(_cells(10, 20, budget=7), max_rows=100)[0].budget == 14


def test_groups_pack_apart():
    cells = {p: (Cell("a", 0, 10, 1, None), Cell("b", 1, 40, 4, None)) for p in range(3)}
    packs = pack_cells(cells, max_rows=100)
    assert [(p.label, p.partitions, p.quota) for p in packs] == [("a", (0, 1, 2), 3), ("b", (0, 1), 8)]
