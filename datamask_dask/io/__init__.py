"""Reading and writing tables.

- :mod:`.parquet`: parquet files and directories in, bounded-memory writers out
- :mod:`.writer`: :func:`~.writer.write_selection`, the atomic, resumable output of a selection
- :mod:`.delta`, :mod:`.iceberg`: Delta Lake and Iceberg tables in (time travel, pushdown) and out
  (one transaction, the run record in the commit metadata); the ``lakehouse`` extra
- :mod:`.tables`: table URIs (parquet path, ``delta://``, ``iceberg://CATALOG/ns.table``), the
  selection-only output, :func:`~.tables.select_table` with incremental runs
"""
