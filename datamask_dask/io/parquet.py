"""Parquet in and out for selection jobs: a tolerant reader and an atomic writer.

Why not only ``dd.read_parquet`` / ``to_parquet``: pandas stores each column's dtype as a string
in the file's ``pandas`` metadata, and for Arrow list types (``fixed_size_list<...>[16][pyarrow]``,
the embedding column) pandas cannot parse that string back. Such files then fail to load, or
load only when every list column is read, which breaks column projection (the quota planning
pass reads only the small columns). So:

- :func:`read_parquet` reads files or (hive-)partitioned directories with pyarrow, ignores the
  stored pandas dtypes and maps every column to its Arrow dtype (``pd.ArrowDtype``), with column
  projection. Index columns stored by pandas/Dask become ordinary columns, except the unnamed
  ones (``__index_level_0__``, ``__null_dask_index__``), which are dropped.
- :func:`write_table` writes without pandas metadata (the Arrow schema is kept, so list sizes and
  types survive); :func:`datamask_dask.io.sinks.write_parquet` writes a Dask DataFrame that way,
  atomically.
"""

from __future__ import annotations

import itertools
import os
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from .. import telemetry
from ..errors import InputDataError
from ..partition.adapters import is_cudf
from .pieces import Pieces, to_dask
from .storage import Location, missing, reach, resolve, storage_errors

_ANONYMOUS_INDEX = re.compile(r"^__index_level_\d+__$|^__null_dask_index__$")
_UNMERGED = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError)  # what unify_schemas raises
ROW_GROUP_BYTES = 64 * 2**20  # the writer buffers one row group: this bounds its memory


def write_table(table: pa.Table, where, **options) -> None:
    """``pq.write_table`` with the options of :func:`write_options` (``where``: path or file)."""
    pq.write_table(table, where, **write_options(table), **options)


def write_options(table: pa.Table) -> dict:
    """Writer options for a table of documents with embedding columns.

    Lists of floats (embeddings) get neither dictionary encoding nor min/max statistics: neither
    helps with embeddings, and skipping both makes writing them faster. Row groups
    hold about ``ROW_GROUP_BYTES``, so the writer never buffers a whole large partition.
    """
    embeddings = float_lists(table.schema)
    plain = [name for name in table.schema.names if name not in embeddings]
    options = {"row_group_size": max(1024, ROW_GROUP_BYTES * table.num_rows // max(table.nbytes, 1))}
    if embeddings:
        options.update(use_dictionary=plain, write_statistics=plain)
    return options


def float_lists(schema: pa.Schema) -> list[str]:
    """The columns of lists of floats (embeddings), which are written without statistics."""
    def is_float_list(kind) -> bool:
        return (pa.types.is_list(kind) or pa.types.is_large_list(kind)
                or pa.types.is_fixed_size_list(kind)) and pa.types.is_floating(kind.value_type)

    return [field.name for field in schema if is_float_list(field.type)]


def _natural_key(path: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path)]


def parquet_pieces(path: str | os.PathLike, rows_per_partition: int = 1_000_000,
                   storage_options: dict | None = None, *, split_row_groups: bool = False) -> Pieces:
    """List ``path``'s partitions as :func:`read_parquet` makes them (reads only the footers).

    Each piece is ``(file path, row groups, hive keys)``: consecutive row groups of one file up
    to about ``rows_per_partition`` rows, files in natural name order. With ``split_row_groups``,
    a row group of more than ``rows_per_partition`` rows becomes pieces of one row range each,
    ``(file path, (row group,), hive keys, (first row, end row))``, of nearly equal sizes: a
    one-file, one-row-group input still makes many tasks. The schema has the hive partition keys
    as columns and leaves out unnamed pandas index columns. ``path`` is a local path or a URI
    (``s3://...``; see :mod:`.storage`); the reader opens files on its filesystem. ``rows``: each
    piece's row count, and ``nbytes`` its uncompressed bytes (about its Arrow size in memory), from
    the footers.
    """
    rows_per_partition = max(1, int(rows_per_partition))
    location = resolve(path, storage_options)
    if not reach(location):
        raise missing(location)
    filesystem = None if location.local else location.fs
    if not location.local:  # what this process listed before (a table since replaced) is listed again
        location.fs.invalidate_cache(location.path)
    with storage_errors(location):  # the listing and the footers: the input's first reads
        dataset = ds.dataset(location.path, format="parquet", partitioning="hive", filesystem=filesystem)
        fragments = sorted(dataset.get_fragments(), key=lambda f: _natural_key(f.path))
        if not fragments:  # a directory without data files: a table of no columns would be read
            raise InputDataError(f"{location.uri} holds no parquet files: point to a parquet file or a "
                                 "directory of them (hive key=value folders too)")
        pieces, counts, sizes, partition_names, footers, distinct = [], [], [], {}, {}, []
        for fragment in fragments:
            keys = ds.get_partition_keys(fragment.partition_expression)
            partition_names.update(dict.fromkeys(keys))
            groups, rows, size = [], 0, 0
            metadata = fragment.metadata
            if not any(metadata.schema.equals(seen) for seen in distinct):  # most tables: one schema
                distinct.append(metadata.schema)
                footers[fragment.path] = metadata.schema.to_arrow_schema()
            for index in range(metadata.num_row_groups):
                group = metadata.row_group(index)
                n_rows = group.num_rows
                split = split_row_groups and n_rows > rows_per_partition
                if groups and (split or rows + n_rows > rows_per_partition):
                    pieces.append((fragment.path, tuple(groups), keys))
                    counts.append(rows)
                    sizes.append(size)
                    groups, rows, size = [], 0, 0
                if split:
                    count = -(-n_rows // rows_per_partition)
                    bounds = [n_rows * i // count for i in range(count + 1)]
                    for start, end in itertools.pairwise(bounds):
                        pieces.append((fragment.path, (index,), keys, (start, end)))
                        counts.append(end - start)
                        sizes.append(-(-group.total_byte_size * (end - start) // n_rows))
                    continue
                groups.append(index)
                rows += n_rows
                size += group.total_byte_size
            if groups or not metadata.num_row_groups:
                pieces.append((fragment.path, tuple(groups), keys))
                counts.append(rows)
                sizes.append(size)
    schema = pa.schema([f for f in table_schema(dataset.schema, footers)
                        if not _ANONYMOUS_INDEX.match(f.name)])
    return Pieces(schema, pieces, ParquetReader(schema, list(partition_names), filesystem),
                  {"format": "parquet", "uri": location.uri}, counts, sizes)


def table_schema(first: pa.Schema, footers: dict[str, pa.Schema]) -> pa.Schema:
    """The schema of a table whose files may differ (``first``: pyarrow's, from the first file, with the
    hive keys; ``footers``: one file's schema of each distinct one): every column some file holds, each
    in the type that holds all its files' values (float32 and float64: float64), as Spark's
    ``mergeSchema`` reads them. A column a file lacks is null in its rows (:class:`ParquetReader`); no
    file's column is left out."""
    try:
        return pa.unify_schemas([first, *(schema.remove_metadata() for schema in footers.values())],
                                promote_options="permissive")
    except _UNMERGED as exc:
        for name in dict.fromkeys(n for schema in footers.values() for n in schema.names):
            held = [(schema.field(name), path) for path, schema in footers.items() if name in schema.names]
            for (field, path), (other, there) in itertools.pairwise(held):
                if not _merge(field, other):
                    raise InputDataError(f"column {name!r} is {field.type} in {path} and {other.type} in "
                                         f"{there}, types no one column holds: write the files with one type "
                                         "for it") from exc
        raise InputDataError(f"the table's files have schemas that do not merge: {exc}") from exc


def _merge(one: pa.Field, other: pa.Field) -> bool:
    try:
        pa.unify_schemas([pa.schema([one]), pa.schema([other])], promote_options="permissive")
    except _UNMERGED:
        return False
    return True


def read_parquet(path: str | os.PathLike, *, columns: list[str] | None = None,
                 rows_per_partition: int = 1_000_000, backend: str = "pandas",
                 storage_options: dict | None = None, split_row_groups: bool = False):
    """Read a parquet file or directory into a Dask DataFrame of Arrow-typed pandas partitions
    (or cuDF partitions, read on the GPU by cuDF's own reader).

    Parameters
    ----------
    path : str or path
        A parquet file, or a directory of them (hive ``key=value`` subdirectories become columns):
        a local path or a URI such as ``s3://bucket/corpus/`` (:mod:`.storage`).
    columns : list of str, optional
        Columns to read (all by default).
    backend : {"pandas", "cudf"}
        ``"cudf"`` reads each piece with ``cudf.read_parquet`` straight into GPU memory
        (fixed-size lists arrive as cuDF lists; dask-cudf's own reader rejects them), with the
        same pieces, order and partition columns as on pandas.
    storage_options : dict, optional
        For a URI: the fsspec filesystem's options (credentials, ``endpoint_url``...); by default
        its usual environment variables apply.
    rows_per_partition : int
        Consecutive row groups of a file are read together up to about this many rows; every
        partition comes from one file, in natural file-name order.
    split_row_groups : bool
        Also cut a row group of more than ``rows_per_partition`` rows into row ranges (off by
        default: a selection's partitions, hence its rows, stay as they were).

    Returns
    -------
    dask.dataframe.DataFrame

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    StorageError
        Its object store cannot be reached, refuses the credentials or the read, or has no such bucket
        (the message names ``path`` and what to set).
    """
    if backend not in ("pandas", "cudf"):
        raise ValueError(f"backend={backend!r}: expected 'pandas' or 'cudf'")
    pieces = parquet_pieces(path, rows_per_partition, storage_options, split_row_groups=split_row_groups)
    frame = to_dask(pieces, "datamask-read-parquet") if backend == "pandas" else to_cudf_dask(pieces)
    return frame if columns is None else frame[list(columns)]


def to_cudf_dask(pieces: Pieces):
    """A Dask DataFrame of cuDF partitions, one per piece of :func:`parquet_pieces`, each read by
    ``cudf.read_parquet`` straight into GPU memory."""
    import cudf
    import dask.dataframe as dd

    meta = cudf.DataFrame.from_arrow(pieces.schema.empty_table().cast(variable_lists(pieces.schema)))
    return dd.from_map(_read_piece_cudf, pieces.items, schema=pieces.schema,
                       partition_names=pieces.reader.partition_names, filesystem=pieces.reader.filesystem,
                       meta=meta, label="datamask-read-parquet", enforce_metadata=False)


@telemetry.timed_read
def _read_piece_cudf(piece, schema: pa.Schema, partition_names: list[str], filesystem=None,
                     columns: list[str] | None = None):
    """Row groups of one file as a cuDF frame (``columns``: Dask's projection)."""
    import cudf

    columns = list(schema.names) if columns is None else list(columns)
    path, groups, keys = piece[:3]
    file_columns = [c for c in columns if c not in partition_names]
    source = path if filesystem is None else filesystem.open(path, "rb")
    frame = cudf.read_parquet(source, columns=file_columns, row_groups=[list(groups)])
    if len(piece) > 3:  # a row range of one row group
        frame = frame.iloc[piece[3][0]:piece[3][1]].reset_index(drop=True)
    for name in columns:
        if name in partition_names:
            value = pa.repeat(pa.scalar(keys.get(name), type=schema.field(name).type), len(frame))
            frame[name] = cudf.Series.from_arrow(value)
    return frame[columns]


def variable_lists(schema: pa.Schema) -> pa.Schema:
    """``schema`` with fixed-size lists (embeddings) as lists: what cuDF and Delta hold them as."""
    return pa.schema([pa.field(f.name, pa.list_(f.type.value_type)) if pa.types.is_fixed_size_list(f.type)
                      else f for f in schema])


class ParquetReader:
    """Reads a piece of :func:`parquet_pieces` as an Arrow table of the table's types."""

    def __init__(self, schema: pa.Schema, partition_names: list[str], filesystem=None):
        # filesystem: the fsspec filesystem of a remote table (None: local files, read natively)
        self.schema, self.partition_names, self.filesystem = schema, partition_names, filesystem

    def __call__(self, piece, columns: list[str]) -> pa.Table:
        path, groups, keys = piece[:3]
        file_columns = [c for c in columns if c not in self.partition_names]
        source = pq.ParquetFile(path, filesystem=self.filesystem)
        if len(piece) > 3:
            table = _row_range(source, groups[0], *piece[3], file_columns)
        else:
            # One row group at a time, kept as chunks (no concatenation copy): decoding a list column
            # needs transient level buffers several times the data, so this bounds the peak; then the
            # allocator gives what decoding freed back to the OS instead of holding it for the worker.
            table = pa.concat_tables([source.read_row_group(group, columns=file_columns) for group in groups])
        pa.default_memory_pool().release_unused()
        arrays = []
        for name in columns:
            field = self.schema.field(name)
            if name in self.partition_names:
                arrays.append(pa.repeat(pa.scalar(keys.get(name), type=field.type), table.num_rows))
            elif name in table.column_names:
                arrays.append(table.column(name).cast(field.type))
            else:  # a column other files of the table hold (table_schema)
                arrays.append(pa.nulls(table.num_rows, field.type))
        return pa.table(arrays, names=columns)


def _row_range(source: pq.ParquetFile, group: int, start: int, end: int, columns: list[str]) -> pa.Table:
    """Rows ``start`` to ``end`` of row group ``group``, streamed: batches before ``start`` are decoded
    and dropped (pyarrow reads no row ranges), and decoding stops at ``end``."""
    if not columns:  # only hive keys: the rows are counted, not read
        return source.read_row_group(group, columns=[]).slice(start, end - start)
    kept, seen = [], 0
    for batch in source.iter_batches(batch_size=max(1, min(end - start, 65536)), row_groups=[group],
                                     columns=columns):
        if seen + batch.num_rows > start:
            kept.append(batch.slice(max(0, start - seen), end - max(start, seen)))
        seen += batch.num_rows
        if seen >= end:
            break
    if not kept:
        return source.read_row_group(group, columns=columns).slice(0, 0)
    return pa.Table.from_batches(kept)


def to_arrow(frame) -> pa.Table:
    """A pandas or cuDF frame (or an Arrow table) as Arrow, without the index or pandas' metadata
    (its dtype strings for Arrow list columns cannot be read back)."""
    if isinstance(frame, pa.Table):
        return frame.replace_schema_metadata(None)
    if is_cudf(frame):
        table = frame.to_arrow(preserve_index=False)
    else:
        table = pa.Table.from_pandas(frame, preserve_index=False)
    return table.replace_schema_metadata(None)


def concatenate(files: list[Location], where, schema: pa.Schema) -> None:
    """Write the rows of parquet ``files``, in order, as one file of ``schema`` (``where``: path or
    file), one row group at a time, each cast to ``schema`` where it differs."""
    options = write_options(schema.empty_table())
    options.pop("row_group_size")  # each part's row groups stay as they are
    with pq.ParquetWriter(where, schema, **options) as writer:
        for file in files:
            source = parquet_file(file)
            for index in range(source.num_row_groups):
                table = source.read_row_group(index)
                writer.write_table(table if table.schema.equals(schema) else table.cast(schema))


def parquet_file(file) -> pq.ParquetFile:
    """A parquet file from a local path or a :class:`~.storage.Location` (any filesystem)."""
    if isinstance(file, Location):
        return pq.ParquetFile(file.path, filesystem=None if file.local else file.fs)
    return pq.ParquetFile(file)


def read_row_groups(files: list, columns: list[str], n: int, seed: int = 0) -> pd.DataFrame:
    """About ``n`` rows of parquet ``files`` (``columns`` only): random whole row groups, thinned to ``n``.

    Reading whole row groups keeps the cost near ``n`` rows' worth of I/O whatever the table size;
    rows keep their file order.
    """
    rng = np.random.default_rng(seed)
    groups = []
    for file in files:
        metadata = parquet_file(file).metadata
        groups += [(file, g, metadata.row_group(g).num_rows) for g in range(metadata.num_row_groups)]
    chosen, total = [], 0
    for index in rng.permutation(len(groups)):
        if total >= n:
            break
        chosen.append(groups[index])
        total += groups[index][2]
    chosen.sort(key=lambda item: (str(item[0]), item[1]))
    tables = []
    for file, group, _ in chosen:
        source = parquet_file(file)
        present = [c for c in columns if c in source.schema_arrow.names]
        tables.append(source.read_row_group(group, columns=present))
    if not tables:
        return pd.DataFrame(columns=columns)
    table = pa.concat_tables(tables, promote_options="default")
    if table.num_rows > n:
        table = table.take(np.sort(rng.choice(table.num_rows, n, replace=False)))
    return table.to_pandas(types_mapper=_list_as_arrow)


def _list_as_arrow(pa_type):
    """Keep list columns (embeddings) Arrow-backed, as the package's readers do."""
    if pa.types.is_list(pa_type) or pa.types.is_fixed_size_list(pa_type) or pa.types.is_large_list(pa_type):
        return pd.ArrowDtype(pa_type)
    return None
