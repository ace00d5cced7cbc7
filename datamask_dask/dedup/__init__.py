"""Near-duplicates across the whole table (``diversity_scope="table"``): one rule at every size.

A row is set aside (*shadowed*) when a verified better row is its near-duplicate (candidates from
SimHash signatures, verified on the exact cosine of the embeddings where the search has them); a
kept row stands for the rows it shadows. Engine-agnostic below the wiring (numpy, numba, and torch
for signing):

- :mod:`.simhash`: SimHash signatures, the Hamming limits, near-duplicate pair counts
- :mod:`.stages`: the rule as sharded map-shuffle-reduce stages, each task holding a shard
- :mod:`.search`: the rule in one task (the same groups), and which of the two a table's partition
  count takes
- :mod:`.dask_graph`: the stages wired into a Dask graph (task to task, or DataFrame shuffles);
  Spark's wiring is :mod:`datamask_spark.shards`
"""
