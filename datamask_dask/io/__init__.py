"""Reading and writing tables.

- :mod:`.parquet`: parquet files and directories in, bounded-memory writers out
- :mod:`.writer`: :func:`~.writer.write_selection`, the atomic, resumable output of a selection
"""
