"""The Dask operator: the plan pass and the select pass as Dask graphs.

- :mod:`.operator`: :func:`~.operator.datamask_select`, ``plan_selection``, ``apply_plan``
- :mod:`.validate`: :func:`~.validate.validate_table` (``datamask validate``)
"""
