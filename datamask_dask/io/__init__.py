"""Reading and writing tables: no selection happens here.

- :mod:`.parquet`: parquet files and directories in, bounded-memory writers out
- :mod:`.delta`, :mod:`.iceberg`: Delta Lake and Iceberg tables in (time travel, pushdown) and out
  (one transaction, the run record in the commit metadata); the ``lakehouse`` extra
- :mod:`.tables`: table URIs (parquet path, ``delta://``, ``iceberg://CATALOG/ns.table``) and the
  selection-only output's columns
- :mod:`.sinks`: where a run's tasks write and how its output is committed (parquet here, Delta
  and Iceberg in their modules)
- :mod:`.output`: the rules that keep a user's data safe; :mod:`.storage`: URIs as locations
"""
