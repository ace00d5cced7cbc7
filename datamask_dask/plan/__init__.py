"""Planning a selection over a whole table: exact quotas, memory budgets, the reduction to one plan.

Engine-agnostic (no Dask, no Spark): the engines collect per-partition summaries and hand them to
:func:`datamask_dask.plan.reduce.make_plan`.

- :mod:`.quotas`: quality sketches, quotas and token budgets per partition and chunk
- :mod:`.memory`: chunk and batch sizes that fit a memory budget
- :mod:`.reduce`: partition summaries -> the plan every partition's task follows
- :mod:`.duplicates`: SimHash signatures, the verification threshold, near-duplicate pair counts
- :mod:`.search`: the near-duplicate rule in one task, and which wiring a table's partitions take
- :mod:`.shards`: the same rule as a sharded map-shuffle-reduce graph (the same groups)
"""
