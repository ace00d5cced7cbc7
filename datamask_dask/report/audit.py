"""The audit of an explained selection (``explain=True``), read from its output: never rerun.

- :func:`output_record`, :func:`read_output`: a finished output's run record, and some of its
  columns (parquet file or directory, Delta or Iceberg table; local or object storage).
- :func:`audit`: counts per reason, the near-duplicate groups (each kept row with the rows set aside
  behind it) and the share of groups whose kept row is the best by quality (the report's section).
- :func:`row_story`: one row's reason, quality, group, partition quota and rank (``datamask explain``).

A group is a kept row and every near-duplicate whose ``duplicate_of`` links lead to it: each link
names a verified better near-duplicate, so a chain ``a -> b -> c`` is one group kept by ``c``.
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd

from ..io.parquet import parquet_file, read_row_groups
from ..io.storage import resolve
from ..io.tables import parse_table_uri, read_table, table_record
from ..options import TEXT_COLUMN, SelectOptions
from ..partition.adapters import is_numeric_dtype, plain
from ..partition.explain import DUPLICATE_COLUMN, REASON_COLUMN, REASONS, SIMILARITY_COLUMN
from ..run.record import RunRecord
from ..run.summary import RunSummary

SNIPPET = 160  # characters of text shown per row
MAX_DEPTH = 64  # links followed from a near-duplicate to its kept row


def output_record(output) -> dict:
    """The run record of a datamask selection's output (FileNotFoundError or ValueError where it has
    none, or another kind of run's)."""
    table = parse_table_uri(output)
    if table.format == "parquet":
        record = RunSummary.read(resolve(table.location)).record
    else:
        record = table_record(table)  # of a Delta commit or an Iceberg snapshot
        if record is None:
            raise ValueError(f"{table.uri} has no datamask run record: it was not written by "
                             "`datamask select`")
    try:
        RunRecord.from_dict(record)
    except ValueError as exc:
        raise ValueError(f"{table.uri}: {exc}") from None  # another command's output, or a newer format
    return record


def read_output(output, columns: list[str], record: dict) -> pd.DataFrame:
    """``columns`` (those present) of every row of a datamask output whose run record
    (:func:`output_record`) is ``record``; those a selection-only output leaves out (the quality, the
    text) are joined back from the input snapshot it was selected from, on the id."""
    table = parse_table_uri(output)
    if table.format == "parquet":
        files = data_files(resolve(table.location), record)
        frame = read_row_groups(files, columns, sys.maxsize)
        frame["_partition"] = _file_partitions(files, frame, columns)
    else:
        ddf = read_table(table).frame
        frame = ddf[[c for c in columns if c in ddf.columns]].compute(scheduler="threads")
        frame = frame.reset_index(drop=True)
    missing = [c for c in columns if c not in frame.columns]
    if missing and selection_only(record):
        id_column = RunRecord.from_dict(record).options.id_column
        try:
            source = read_table(input_uri(record)).frame
        except FileNotFoundError as exc:  # moved or removed since the run
            raise FileNotFoundError(f"{output} is a selection-only output, whose other columns "
                                    f"({', '.join(missing)}) are read from its input: {exc} (restore the "
                                    "input there, or select with --output-columns all to keep every column "
                                    "in the output)") from None
        wanted = [c for c in missing if c in source.columns]
        if wanted:  # a left join keeps the output's rows in their order
            frame = frame.merge(source[[id_column, *wanted]].compute(scheduler="threads"), on=id_column,
                                how="left")
    return _integral_links(frame)


def selection_only(record: dict) -> bool:
    """Whether the run wrote a selection-only output (the id, the selection and the run; no input column)."""
    return (record.get("output") or {}).get("columns") == "selection"


def input_uri(record: dict) -> str:
    """The table URI of the input snapshot a run read, from its run record."""
    read, version = record["input"], record["input"].get("version")
    kind, *where = read["table"]
    if kind == "iceberg":
        return f"iceberg://{where[0]}/{where[1]}" + ("" if version is None else f"?snapshot_id={version}")
    if kind == "delta":
        base = f"delta://{where[0]}" if where[0].startswith("/") else f"delta+{where[0]}"
        return base + ("" if version is None else f"?version={version}")
    return where[0]


def _integral_links(frame: pd.DataFrame) -> pd.DataFrame:
    """``duplicate_of`` as nullable integers where a reader gave integer ids back as floats (NaN for null)."""
    column = frame.get(DUPLICATE_COLUMN)
    if column is not None and pd.api.types.is_float_dtype(column.dtype):
        values = column.dropna().to_numpy()
        if np.array_equal(values, np.round(values)):
            frame[DUPLICATE_COLUMN] = column.astype("Int64")
    return frame


def data_files(source, record: dict) -> list:
    """The data files of a parquet output (a file, or the parts its run record lists)."""
    if source.isfile():
        return [source]
    present = set(source.list())
    files = [source.child(name) for name in record.get("files", []) if name in present]
    return files or [source.child(name) for name in sorted(present) if name.endswith(".parquet")]


def nearest_selected(output, record: dict, options: SelectOptions, value, k: int = 3,
                     chosen_ids: np.ndarray | None = None) -> list[dict]:
    """The ``k`` selected rows whose embeddings are nearest the row of id ``value`` (cosine), read
    file by file (parquet: only the selected rows' part of each file is kept, and the row's own file
    is found by its id's statistics). ``record``: its run record; ``options``: the run's.
    ``chosen_ids``: the selected rows' ids, where ``output`` is the input a selection-only output was
    selected from (it holds the embeddings, not the selection)."""
    import pyarrow.parquet as pq

    from ..run.summary import unit_rows

    id_column, embedding, selected = options.id_column, options.embedding_column, options.selected_column
    table = parse_table_uri(output)
    if table.format == "parquet" and chosen_ids is None:
        files = data_files(resolve(table.location), record)

        def read(file, filters):
            found = pq.read_table(file.path, columns=[id_column, embedding], filters=filters,
                                  filesystem=None if file.local else file.fs)
            return found.to_pandas(types_mapper=pd.ArrowDtype)

        if not files or embedding not in parquet_file(files[0]).schema_arrow.names:
            return []
        mine = next((f for f in (read(file, [(id_column, "==", value)]) for file in files) if len(f)), None)
        chosen = pd.concat([read(file, [(selected, "==", True)]) for file in files], ignore_index=True)
    else:
        ddf = read_table(table).frame
        if embedding not in ddf.columns:
            return []
        mine = ddf.loc[ddf[id_column] == value, [id_column, embedding]].compute(scheduler="threads")
        wanted = ddf[selected] if chosen_ids is None else ddf[id_column].isin(chosen_ids)
        chosen = ddf.loc[wanted, [id_column, embedding]].compute(scheduler="threads")
    if mine is None or not len(mine) or not len(chosen):
        return []
    chosen = chosen[chosen[id_column] != value].reset_index(drop=True)
    cosine = unit_rows(chosen[embedding]) @ unit_rows(mine[embedding].iloc[:1])[0]
    best = np.argsort(-cosine, kind="stable")[:k]
    return [{"id": plain(chosen[id_column].iloc[i]), "cosine": float(cosine[i])} for i in best]


def _file_partitions(files, frame, columns) -> np.ndarray:
    """The partition of each row, from the part file it came from (``part.N.parquet``); -1 if unknown."""
    numbers = []
    for file in sorted(files, key=lambda f: str(f)):
        name = str(getattr(file, "path", file)).rsplit("/", 1)[-1]
        pieces = name.split(".")
        number = int(pieces[1]) if len(pieces) == 3 and pieces[1].isdigit() else -1
        numbers.append(np.full(parquet_file(file).metadata.num_rows, number))
    out = np.concatenate(numbers) if numbers else np.zeros(0, dtype=np.int64)
    return out if out.size == len(frame) else np.full(len(frame), -1)


def quality_of(frame: pd.DataFrame, options: SelectOptions) -> np.ndarray:
    """The combined quality of each row, as the selection weighed the quality columns."""
    return sum(w * pd.to_numeric(frame[c]).to_numpy(dtype=np.float64) for c, w in options.quality)


def explained_columns(options: SelectOptions) -> list[str]:
    """The columns the audit reads from an output selected with ``options``."""
    names = [c for c, _ in options.quality]
    names += [options.id_column, options.selected_column, REASON_COLUMN, DUPLICATE_COLUMN, SIMILARITY_COLUMN]
    names += [options.by] if options.by else []
    return list(dict.fromkeys(names))


def kept_rows(ids: np.ndarray, duplicate_of: np.ndarray) -> np.ndarray:
    """The kept row (its position) each row's ``duplicate_of`` links lead to; -1 where they leave the
    output (a selection-only output of part of a table) or loop."""
    position = pd.Series(np.arange(len(ids)), index=pd.Index(ids))
    parent = np.full(len(ids), -1, dtype=np.int64)
    linked = ~pd.isna(duplicate_of)
    parent[linked] = position.reindex(pd.Index(duplicate_of[linked])).fillna(-1).to_numpy(np.int64)
    root = np.where(linked, parent, np.arange(len(ids)))
    for _ in range(MAX_DEPTH):
        moving = (root >= 0) & (parent[np.maximum(root, 0)] >= 0)
        if not moving.any():
            break
        root[moving] = parent[root[moving]]
    root[(root >= 0) & (parent[np.maximum(root, 0)] >= 0)] = -1
    return root


def audit(frame: pd.DataFrame, options: SelectOptions, *, groups: int = 8, seed: int = 0,
          text_column: str = TEXT_COLUMN) -> dict | None:
    """Counts per reason, a sample of near-duplicate groups and how often the kept row is the best.

    Returns None when the output has no ``reason`` column (it was written without ``explain``).
    """
    if REASON_COLUMN not in frame.columns:
        return None
    id_column = options.id_column
    reason = frame[REASON_COLUMN].astype(str).to_numpy()
    counts = pd.Series(reason).value_counts().reindex(list(REASONS), fill_value=0)
    quality = quality_of(frame, options)
    root = kept_rows(frame[id_column].to_numpy(), _links(frame))
    near = np.flatnonzero(reason == "near-duplicate")
    members = pd.DataFrame({"root": root[near], "row": near}).query("root >= 0")
    best = members.assign(q=quality[members["row"]]).groupby("root")["q"].max()
    kept_best = quality[best.index.to_numpy()] >= best.to_numpy()
    rng = np.random.default_rng(seed)
    shown = rng.permutation(best.index.to_numpy())[:groups]
    text = text_column if text_column in frame.columns else None
    sample = []
    for kept in sorted(shown.tolist(), key=lambda r: -int((members["root"] == r).sum())):
        rows = members.loc[members["root"] == kept, "row"].to_numpy()
        sample.append({"kept": _row(frame, kept, id_column, quality, reason, text),
                       "set_aside": [_row(frame, r, id_column, quality, reason, text) for r in rows]})
    return {"rows": len(frame), "counts": {k: int(v) for k, v in counts.items()}, "groups": int(best.size),
            "kept_best": int(kept_best.sum()),
            "kept_best_share": float(kept_best.mean()) if best.size else None,
            "kept_selected": int((reason[best.index.to_numpy()] == "selected").sum()), "sample": sample}


def _links(frame) -> np.ndarray:
    column = frame[DUPLICATE_COLUMN]
    return column.astype(object).where(column.notna(), None).to_numpy()


def _row(frame, position: int, id_column: str, quality, reason, text) -> dict:
    row = frame.iloc[position]
    similarity = row[SIMILARITY_COLUMN]
    out = {"id": plain(row[id_column]), "quality": float(quality[position]), "reason": str(reason[position]),
           "similarity": None if pd.isna(similarity) else float(similarity),
           "duplicate_of": None if pd.isna(row[DUPLICATE_COLUMN]) else plain(row[DUPLICATE_COLUMN])}
    if text is not None:
        out["text"] = _snippet(row[text])
    return out


def _snippet(value) -> str:
    value = "" if value is None or (isinstance(value, float) and np.isnan(value)) else str(value)
    value = " ".join(value.split())  # one line: paragraphs and indentation read as one snippet
    return value if len(value) <= SNIPPET else value[:SNIPPET - 1] + "\u2026"


def parse_id(text: str, dtype):
    """The ``--id`` value in the id column's type (a number for a numeric column)."""
    if is_numeric_dtype(dtype):
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
    return text


def row_story(output, row_id: str, *, text_column: str = TEXT_COLUMN, neighbours: int = 3) -> dict:
    """One row's story from an explained output: its reason and quality, its near-duplicate group
    (members, quality, estimated cosine, the kept row), its partition's quota and its quality rank
    there, the ``neighbours`` nearest selected rows by embedding (0: none, nothing more is read) and
    text snippets where a text column exists. Raises ValueError for an output written without
    ``explain``, or an id it does not hold.
    """
    record = output_record(output)
    options = RunRecord.from_dict(record).options
    id_column = options.id_column
    frame = read_output(output, explained_columns(options) + [text_column], record)
    if REASON_COLUMN not in frame.columns:
        raise ValueError(f"{output} has no {REASON_COLUMN!r} column: it was written without explain; run "
                         "`datamask select --explain` (or explain=True) to record reasons")
    if id_column not in frame.columns:
        raise ValueError(f"{output} has no id column {id_column!r} (the run record's id_column)")
    value = parse_id(row_id, frame[id_column].dtype)
    ids = frame[id_column].to_numpy()
    where = np.flatnonzero(ids == value)
    if not where.size:
        raise ValueError(f"--id {row_id!r}: no row of {output} has {id_column} = {value!r} "
                         f"(e.g. {', '.join(repr(plain(v)) for v in ids[:3])})")
    at = int(where[0])
    reason = frame[REASON_COLUMN].astype(str).to_numpy()
    quality = quality_of(frame, options)
    root = kept_rows(ids, _links(frame))
    text = text_column if text_column in frame.columns else None
    story = {"id": plain(value), "row": _row(frame, at, id_column, quality, reason, text),
             "threshold": options.duplicate_cosine, "prune": options.learner.prune,
             "pieces": (record.get("pieces") or {}).get("cut", "partitions")}
    kept = int(root[at])
    in_group = np.flatnonzero((root == kept) & (reason == "near-duplicate") & (kept >= 0))
    if in_group.size:
        story["group"] = {"kept": _row(frame, kept, id_column, quality, reason, text),
                          "members": [_row(frame, r, id_column, quality, reason, text) for r in in_group]}
    part = int(frame["_partition"].iloc[at]) if "_partition" in frame.columns else -1
    if part >= 0:
        mine = frame["_partition"].to_numpy() == part
        by = options.by
        if by:
            mine &= frame[by].to_numpy() == frame[by].iloc[at]
        eligible = mine & ~np.isin(reason, ["near-duplicate", "quality-pruned"])
        chosen = int((reason[mine] == "selected").sum())
        story["partition"] = {"number": part, "rows": int(mine.sum()), "selected": chosen,
                              "eligible": int(eligible.sum()), "group": frame[by].iloc[at] if by else None,
                              "quality_rank": int((quality[mine] > quality[at]).sum()) + 1}
    if neighbours > 0:
        if selection_only(record):  # the embeddings are in the input
            chosen = ids[frame[options.selected_column].to_numpy(dtype=bool)]
            story["nearest_selected"] = nearest_selected(input_uri(record), record, options, plain(value),
                                                         neighbours, chosen)
        else:
            story["nearest_selected"] = nearest_selected(output, record, options, plain(value), neighbours)
    return story


# Where the learner met a row, by how the plan cut the table (the run record's ``pieces``).
_LEARNED_IN = {
    "regions": ("its area", "the pack of its area (pieces=regions: rows learned with their nearest "
                            "neighbours in the embedding space, from every partition)"),
    "context": ("its piece", "the piece it was dealt to (pieces=context)")}


def format_story(story: dict) -> str:
    """``datamask explain``'s text for :func:`row_story`."""
    row = story["row"]
    lines = [f"row {row['id']!r}: {row['reason']} (quality {row['quality']:.4g})"]
    place, learned_in = _LEARNED_IN.get(story["pieces"], ("its partition or chunk", "its chunk"))
    why = {"selected": "it is in the selection",
           "near-duplicate": f"set aside behind row {row['duplicate_of']!r}, a near-duplicate at least "
                             f"as good (estimated cosine {row['similarity'] or float('nan'):.3f}, threshold "
                             f"{story['threshold']})",
           "quality-pruned": f"below the table-wide quality threshold of prune={story['prune']}",
           "quota-exhausted": f"eligible, but its group's quota gave {place} nothing",
           "not-chosen": f"eligible; the learner chose other rows of {learned_in}",
           "budget-exhausted": "chosen by the learner, but the token budget ran out before it"}
    lines.append(f"  why: {why.get(row['reason'], row['reason'])}")
    if "text" in row:
        lines.append(f"  text: {row['text']}")
    if "partition" in story:
        p = story["partition"]
        group = f", group {p['group']!r}" if p["group"] is not None else ""
        lines.append(f"  partition {p['number']}{group}: {p['rows']} rows, {p['eligible']} eligible, "
                     f"{p['selected']} selected; this row ranks {p['quality_rank']} by quality there")
    if "group" in story:
        group = story["group"]
        kept = group["kept"]
        lines.append(f"  near-duplicate group of {len(group['members']) + 1} rows, kept row {kept['id']!r} "
                     f"({kept['reason']}, quality {kept['quality']:.4g}):")
        for member in group["members"]:
            lines.append(f"    {member['id']!r}: quality {member['quality']:.4g}, cosine "
                         f"{member['similarity']:.3f} to {member['duplicate_of']!r}"
                         + (f"  {member['text']}" if "text" in member else ""))
        if "text" in kept:
            lines.append(f"    kept text: {kept['text']}")
    if story.get("nearest_selected"):
        nearest = ", ".join(f"{n['id']!r} ({n['cosine']:.3f})" for n in story["nearest_selected"])
        lines.append(f"  nearest selected rows (cosine): {nearest}")
    return "\n".join(lines)
