"""The Dask engine: the plan pass and the select pass as Dask graphs (Spark's is ``datamask_spark``).

- :mod:`.operator`: :func:`~.operator.datamask_select`, ``plan_selection``, ``apply_plan``
- :mod:`.validate`: :func:`~.validate.validate_table` (``datamask validate``)
"""
