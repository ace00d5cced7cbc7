"""Planning a selection over a whole table: exact quotas, memory budgets, the reduction to one plan.

Engine-agnostic (no Dask, no Spark): the engines collect per-partition summaries and hand them to
:func:`datamask_dask.plan.reduce.make_plan`.

- :mod:`.quotas`: quality sketches, quotas and token budgets per partition and chunk
- :mod:`.memory`: chunk and batch sizes that fit a memory budget
- :mod:`.reduce`: partition summaries -> the plan every partition's task follows

The table-wide near-duplicates each partition's summary leaves out are found in
:mod:`datamask_dask.dedup`.
"""
