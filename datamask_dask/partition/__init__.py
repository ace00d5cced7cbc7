"""One partition of the table (a pandas or cuDF frame), whichever engine holds it.

- :mod:`.adapters`: pandas / cuDF columns to numpy arrays and tensors (the only backend-aware code)
- :mod:`.spec`: :class:`~.spec.SelectSpec`, the resolved options checked against the schema
- :mod:`.checks`: the checks of a partition's rows and its summary for the plan
- :mod:`.select`: :func:`~.select.select_partition`, the select step (learner per chunk)

The Dask operator (:mod:`datamask_dask.dask_engine`) maps these over partitions; the Spark integration
calls them inside ``mapInArrow``.
"""
