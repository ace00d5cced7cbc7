"""Planning a selection over a whole table: exact quotas, memory budgets, the reduction to one plan.

Engine-agnostic (no Dask, no Spark): the engines collect per-partition summaries and hand them to
:func:`datamask_dask.plan.reduce.make_plan`.

- :mod:`.quotas`: quality sketches, quotas and token budgets per partition and chunk
- :mod:`.memory`: chunk and batch sizes that fit a memory budget
- :mod:`.reduce`: partition summaries -> the plan every partition's task follows
- :mod:`.duplicates`: SimHash signatures and the near-duplicate search in one task (the reference)
- :mod:`.shards`: the same search as a sharded map-shuffle-reduce graph (what the engines run)
"""
