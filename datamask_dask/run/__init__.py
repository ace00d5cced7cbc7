"""One run of a selection, from its source to its sink, on any engine (:mod:`.protocol`).

- :mod:`.protocol`: :func:`~.protocol.execute`, the one run protocol, and the engine contract
- :mod:`.work`: the work area (manifest, completion markers) that makes a run resumable
- :mod:`.summary`: the summary in the run record every output keeps (:mod:`.protocol`)
- :mod:`.selection`: :func:`~.selection.write_selection` (parquet output; ``datamask select``)
- :mod:`.tables`: :func:`~.tables.select_table` (table URIs in and out, incremental runs)
"""
