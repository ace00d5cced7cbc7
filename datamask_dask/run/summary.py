"""The run summary: what a selection did, which :func:`datamask_dask.run.protocol.execute` writes
into every run record, whatever the engine and the sink.

- Each partition's task (:func:`part_summary`, on the frame it already holds): group counts,
  tokens, learning curves, a 256-bit SimHash signature and the float16 unit embedding of each
  selected row (of a uniform sample of about ``SIGNATURE_ROWS`` or ``VECTOR_BYTES`` in all) and
  ``sample_rows / partitions`` of its rows drawn at random.
- The driver (:func:`summarise_run`), before the commit: near-duplicate pairs (cosine >=
  ``DUPLICATE_COSINE``) among those selected rows, candidates found on the signatures (LSH, about
  as costly as the table scope's search on a tenth of the table) and confirmed on their cosine;
  and on the samples together, the selection's objective against quality top-k and a random pick
  of as many rows, with each pick's near-duplicate pairs. Coverage metrics (Facility) are measured
  on ``REFERENCE_ROWS`` of the sample, the same rows for every pick: an unbiased estimate at a
  fifth of the cost. Where the output has at most ``YARDSTICK_ROWS`` rows, the yardstick on all of
  them: the selection's share of the best baseline's gain over random.

:class:`RunSummary` reads a record back and turns it into pandas tables.
"""

from __future__ import annotations

import functools
import json
import os
import time

import numpy as np
import pandas as pd

from .record import RunRecord

SAMPLE_ROWS = 20_000  # rows of the output the driver reads to compare the selection with baselines
# The yardstick runs where the output has at most this many rows, on all of them (greedy's cost grows as
# rows^2). On a sample of a larger output greedy picks for the sample, and a selection made for the whole
# table scores low there (greedy's own table-wide picks too): that share would say nothing of the table.
YARDSTICK_ROWS = 4_000
YARDSTICK_WORK = 2e10  # multiply-adds lazy greedy may cost there (above: stochastic greedy)
SIGNATURE_ROWS = 100_000  # at most about this many selected rows' signatures and vectors reach the driver,
VECTOR_BYTES = 16 << 20  # and at most about this many bytes of their float16 vectors
DUPLICATE_COSINE = 0.95  # two rows at least this similar are counted as a near-duplicate pair
# Rows of the sample that Facility's coverage is measured on: its cost, on the driver after the last
# write, is reference x selected x d a pick, and at this size the estimate's standard error is far
# below the picks' differences.
REFERENCE_ROWS = 4096
_BLOCK = 2048  # rows per block of the blocked similarity products


# --------------------------------------------------------------------------- per partition (workers)


def signature_share(plan) -> float:
    """The share of the selected rows whose signatures and vectors go into the run summary (see the
    module notes)."""
    planned = plan.planned
    rows = min(SIGNATURE_ROWS, VECTOR_BYTES // (2 * (plan.dim or 1)))
    return min(1.0, rows / planned) if planned else 1.0


def _selected_rows(series, rows: np.ndarray) -> dict:
    """The rows ``rows`` of an embedding column as the summary carries them (base64): ``signatures``,
    their SimHash, (len(rows), 32) bytes, and ``vectors``, their unit embeddings, float16."""
    import base64

    from ..dedup.simhash import hyperplanes, signatures
    from ..dedup.stages import unit_vectors
    from ..partition.adapters import embedding_source, host_rows

    source = embedding_source(series, f"column {series.name!r}")
    block = source.rows(rows)
    signed = signatures(block, hyperplanes(source.dim))
    unit = unit_vectors(host_rows(block)).astype(np.float16)
    return {name: base64.b64encode(values.tobytes()).decode("ascii")
            for name, values in (("signatures", signed), ("vectors", unit))}


def selected_pairs(parts: list[dict]) -> dict | None:
    """Near-duplicate pairs among the selected rows of every partition, from the signatures and
    vectors in their :func:`part_summary`; None when no partition sent any."""
    import base64

    from ..dedup.simhash import count_pairs

    signed = [part for part in parts if part.get("signatures")]
    if not signed:
        return None
    blocks = [np.frombuffer(base64.b64decode(part["signatures"]), dtype=np.uint8) for part in signed]
    # a part finished by an earlier version of the package, resumed, sent signatures alone
    vectors = [np.frombuffer(base64.b64decode(part["vectors"]), dtype=np.float16) for part in signed] \
        if all("vectors" in part for part in signed) else None
    within, across = count_pairs(blocks, DUPLICATE_COSINE, vectors)
    share = min(part.get("signature_share", 1.0) for part in signed)
    rows = "every selected row" if share >= 1 else f"a uniform sample of {share:.4g} of the selected rows"
    how = "SimHash LSH estimate" if vectors is None else "SimHash LSH candidates confirmed on their cosine"
    method = f"{how} over {rows}"
    return {"rows": int(sum(b.size for b in blocks) // 32), "within": within, "across": across,
            "cosine": DUPLICATE_COSINE, "share": share, "method": method}


def _json_label(label):
    if label is None or (isinstance(label, float) and np.isnan(label)):
        return None
    if hasattr(label, "item"):
        label = label.item()
    return label if isinstance(label, str | int | float | bool) else str(label)


# --------------------------------------------------------------------------- the driver's summary


def part_summary(frame, number: int, spec, sample_rows: int, seed: int = 0, share: float = 1.0,
                 token_column: str | None = None, curves: list | tuple = ()) -> dict:
    """One selected partition's part of the run summary, made by the task that selected it.

    Its rows and selected rows, the learning curves its task noted (``curves``), and where the frame has the
    columns: rows and selected rows per group, tokens in and selected, the SimHash signatures of its
    selected rows (base64, row order; of a uniform sample of them where ``share`` < 1). Also
    ``sample_rows`` of its rows drawn at random (the columns the objective needs), which
    :func:`summarise_run` compares with the baselines.
    """
    from ..partition import adapters

    out: dict = {"curves": list(curves)}
    n = len(frame)
    selected = np.asarray(adapters.host_values(frame, spec.selected_column), dtype=bool)
    embedding, by, token_column = spec.embedding_column, spec.by, token_column or spec.token_column
    if n and embedding is not None and embedding in frame.columns and selected.any():
        rows = np.flatnonzero(selected)
        if share < 1:
            rows = rows[np.random.default_rng([0x516E, number]).random(rows.size) < share]
        out.update(_selected_rows(frame[embedding], rows))
        out["signature_share"] = share
    if n and by is not None and by in frame.columns:
        labels = adapters.host_values(frame, by)
        table = pd.DataFrame({"group": labels.to_numpy(), "selected": selected}).groupby(
            "group", dropna=False, sort=True)["selected"].agg(["size", "sum"])
        out["groups"] = [[_json_label(label), int(row["size"]), int(row["sum"])]
                         for label, row in table.iterrows()]
    if n and token_column is not None and token_column in frame.columns:
        tokens = pd.to_numeric(adapters.host_values(frame, token_column), errors="coerce").to_numpy(
            dtype=np.float64, na_value=np.nan)
        tokens = np.nan_to_num(tokens, nan=0.0)
        out["tokens"] = [float(tokens.sum()), float(tokens[selected].sum())]
    rows = np.sort(np.random.default_rng([seed, number]).choice(n, min(n, sample_rows), replace=False))
    sample = frame[sample_columns(spec)].iloc[rows]
    sample = sample.to_pandas() if adapters.is_cudf(sample) else sample
    return {**out, "partition": number, "rows": n, "selected": int(selected.sum()),
            "sample": sample.reset_index(drop=True)}


def summarise_run(parts: list[dict], spec, *, token_column: str | None = None, sample_rows: int = SAMPLE_ROWS,
                  seed: int = 0) -> dict:
    """The ``summary`` of a run record from its partitions' :func:`part_summary`: their groups,
    tokens (counted in ``token_column`` where no budget names one) and curves, and the selection
    against the baselines on their samples together (stratified: each gave up to ``sample_rows /
    partitions`` rows)."""
    started = time.perf_counter()
    samples = [part["sample"] for part in parts if len(part["sample"])]
    frame = pd.concat(samples, ignore_index=True) if samples else pd.DataFrame(columns=sample_columns(spec))
    groups = [{"partition": part["partition"], "group": g, "rows": r, "selected": s}
              for part in parts for g, r, s in part.get("groups", [])]
    token_parts = [(part["partition"], part["tokens"]) for part in parts if "tokens" in part]
    tokens = None
    if token_parts:
        tokens = {"column": spec.token_column or token_column,
                  "total": sum(t[0] for _, t in token_parts), "selected": sum(t[1] for _, t in token_parts),
                  "per_partition": [{"partition": i, "total": t[0], "selected": t[1]}
                                    for i, t in token_parts]}
    curves = [{"partition": part["partition"], **curve} for part in parts for curve in part.get("curves", [])]
    summary = {"by": spec.by, "groups": groups, "tokens": tokens, "curves": curves,
               "duplicate_cosine": DUPLICATE_COSINE, "selected_pairs": selected_pairs(parts)}
    whole = len(frame) == sum(part["rows"] for part in parts)
    comparison = compare_on_sample(frame, spec, seed=seed, whole=whole)
    summary["sample"] = {"rows": len(frame), "requested": sample_rows, "seed": seed, "whole": whole,
                         **comparison.pop("sample", {}), "stratified": "by partition"}
    summary.update(comparison)
    summary["seconds"] = time.perf_counter() - started
    return summary


def sample_columns(spec) -> list[str]:
    names = [c for c, _ in spec.quality] + [spec.embedding_column, spec.selected_column]
    names += [spec.by] if spec.by else []
    return list(dict.fromkeys(names))


def compare_on_sample(frame: pd.DataFrame, spec, *, seed: int = 0, whole: bool = True) -> dict:
    """Objective and near-duplicate pairs of the selection, quality top-k and random on ``frame``, with
    the run's metric and lamb (``spec.options``); and the yardstick where ``frame`` is ``whole`` (every
    row of the output) and at most ``YARDSTICK_ROWS`` rows."""
    from ..learn.baselines import quality_topk, random_selection
    from ..learn.metrics import evaluate_selection
    from ..partition.checks import quality_values

    algorithm, lamb = spec.options.algorithm, float(spec.options.lamb)
    out = {"algorithm": algorithm, "lamb": lamb, "objective": None}
    if not len(frame):
        return out
    mask = frame[spec.selected_column].to_numpy(dtype=bool)
    k = int(mask.sum())
    out["sample"] = {"rows": len(frame), "selected": k}
    if k == 0:
        return out
    quality = quality_values(frame, spec, "the output sample")
    embeddings = unit_rows(frame[spec.embedding_column])
    picks = {"datamask": np.flatnonzero(mask),
             "quality_topk": quality_topk(quality, embeddings, k),
             "random": random_selection(quality, embeddings, k, seed=seed)}
    reference = None
    if len(frame) > REFERENCE_ROWS:  # drawn apart from every pick (another stream of the seed)
        draw = np.random.default_rng([seed, 1]).choice(len(frame), REFERENCE_ROWS, replace=False)
        reference = np.sort(draw)
        out["sample"]["reference_rows"] = REFERENCE_ROWS
    table = {}
    for name, rows in picks.items():
        value = evaluate_selection(quality, embeddings, rows, algorithm=algorithm, lamb=lamb,
                                   reference=reference)
        table[name] = {"objective": value["objective"], "quality": value["quality"],
                       "diversity": value["diversity"], "rows": k,
                       "near_duplicate_pairs": near_duplicate_pairs(embeddings[np.sort(rows)])}
    out["objective"] = table
    out["yardstick"] = yardstick(quality, embeddings, mask, algorithm, lamb) \
        if whole and len(frame) <= YARDSTICK_ROWS else None
    return out


def yardstick(quality, embeddings, mask, algorithm, lamb: float) -> dict | None:
    """The selection's share of the best baseline's gain over random on every row of a small output."""
    from ..learn.yardstick import measure

    if not 0 < int(mask.sum()) < len(mask):
        return None
    score = measure(quality, embeddings, mask, algorithm=algorithm, lamb=lamb, seeds=3,
                    greedy_max_work=YARDSTICK_WORK)
    return {"rows": len(mask), "selected": int(mask.sum()), **score.as_dict()}


def unit_rows(series) -> np.ndarray:
    """An embedding column as an L2-normalised float32 matrix (zero rows stay zero)."""
    from ..partition.adapters import embedding_matrix

    matrix = np.asarray(embedding_matrix(series.reset_index(drop=True)), dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms > 0, norms, 1.0)


def near_duplicate_pairs(unit: np.ndarray, threshold: float = DUPLICATE_COSINE) -> int:
    """Pairs ``i < j`` of unit rows with cosine >= ``threshold`` (blocked: O(block * n) memory)."""
    count = 0
    for start in range(0, len(unit), _BLOCK):
        rows = unit[start:start + _BLOCK]
        # the block's pairs among themselves (upper triangle of a small square), then with later rows
        count += int(np.count_nonzero(np.triu(rows @ rows.T >= threshold, k=1)))
        count += int(np.count_nonzero(rows @ unit[start + len(rows):].T >= threshold))
    return count


# --------------------------------------------------------------------------- reading it back


class RunSummary:
    """A finished output's run record with its summary, as Python objects and pandas tables.

    Get one with ``RunSummary.read(path)`` or from ``write_selection(...).summary``. The record
    is in :attr:`record` (a dict); ``summary[key]`` reads it too.
    """

    TABLES = ("overview", "objective", "partitions", "groups", "curves", "stages", "phases", "settings",
              "versions")

    def __init__(self, record: dict):
        self.record = record

    @functools.cached_property
    def run(self) -> RunRecord:
        """The record, typed: :class:`~datamask_dask.run.record.RunRecord`, its settings as the options."""
        return RunRecord.from_dict(self.record)

    @classmethod
    def read(cls, path: str | os.PathLike) -> RunSummary:
        """The run summary of the datamask output at ``path`` (directory or single parquet file)."""
        from ..io.output import read_record
        from ..io.storage import reach, resolve

        if not reach(resolve(path)):  # first: a store that cannot be reached is told in one line
            raise FileNotFoundError(f"{path} does not exist")
        record = read_record(path)
        if record is None:
            raise FileNotFoundError(f"{path} has no datamask run record: it was not written by "
                                    "datamask_dask.write_selection (or `datamask select`)")
        return cls(record)

    def __getitem__(self, key):
        return self.record[key]

    def __repr__(self) -> str:
        return f"RunSummary({self.run.rows} rows, {self.run.selected} selected, run {self.run.run_id})"

    @property
    def summary(self) -> dict:
        """The ``summary`` section (empty for outputs of older versions)."""
        return self.record.get("summary") or {}

    def to_json(self) -> str:
        return json.dumps(self.record, indent=1, sort_keys=True)

    def to_pandas(self, table: str = "overview") -> pd.DataFrame:
        """One table of the summary.

        ``"overview"`` (default): one row per scalar field (``field``, ``value``): rows, selected,
        share, tokens, seed, input location, sample, seconds per phase and stage, objective
        values... ``"objective"``: selection vs baselines on the sample (rows ``datamask``,
        ``quality_topk``, ``random``). ``"partitions"``: rows, selected (and tokens) per
        partition. ``"groups"``: per group (``by``), summed over partitions. ``"curves"``: the
        learning curves, long form (``partition``, ``chunk``, ``step``, ``objective``).
        ``"stages"``, ``"phases"``, ``"settings"``, ``"versions"``: name / value.
        """
        record, summary = self.record, self.summary
        if table == "overview":
            return pd.DataFrame(list(self._overview()), columns=["field", "value"])
        if table == "objective":
            values = summary.get("objective") or {}
            columns = ["objective", "quality", "diversity", "near_duplicate_pairs", "rows"]
            frame = pd.DataFrame.from_dict(values, orient="index", columns=columns)
            frame.index.name = "selection"
            return frame
        if table == "partitions":
            frame = pd.DataFrame(list(self.run.partitions), columns=["partition", "rows", "selected"])
            tokens = (summary.get("tokens") or {}).get("per_partition")
            if tokens:
                frame = frame.merge(pd.DataFrame(tokens).rename(columns={"total": "tokens",
                                                                        "selected": "tokens_selected"}),
                                    on="partition", how="left")
            frame["share"] = frame["selected"] / frame["rows"].clip(lower=1)
            return frame
        if table == "groups":
            columns = ["partition", "group", "rows", "selected"]
            frame = pd.DataFrame(summary.get("groups", []), columns=columns)
            frame = frame.groupby("group", dropna=False, sort=True)[["rows", "selected"]].sum().reset_index()
            frame["share"] = frame["selected"] / frame["rows"].clip(lower=1)
            return frame
        if table == "curves":
            rows = [(c["partition"], c["chunk"], s, v) for c in summary.get("curves", [])
                    for s, v in zip(c["step"], c["objective"], strict=True)]
            return pd.DataFrame(rows, columns=["partition", "chunk", "step", "objective"])
        if table in ("stages", "phases", "settings", "versions"):
            values = record.get(table) or {}
            return pd.DataFrame([(k, _cell(v)) for k, v in sorted(values.items())], columns=["name", "value"])
        raise ValueError(f"unknown table {table!r}; one of {', '.join(self.TABLES)}")

    def _overview(self):
        run, summary = self.run, self.summary
        yield "run_id", run.run_id
        yield "finished", run.finished
        yield "input", run.input.get("location")
        yield "rows", run.rows
        yield "selected", run.selected
        yield "share", run.selected / run.rows if run.rows else None
        yield "partitions", len(run.partitions)
        yield "seed", run.options.learner.seed
        yield "algorithm", _cell(summary.get("algorithm"))
        yield "lamb", summary.get("lamb")
        if summary.get("by"):
            yield "by", summary["by"]
            yield "groups", len(self.to_pandas("groups"))
        tokens = summary.get("tokens")
        if tokens:
            yield "token_column", tokens["column"]
            yield "tokens", tokens["total"]
            yield "tokens_selected", tokens["selected"]
        pairs = summary.get("selected_pairs")
        if pairs:  # over the selected rows (a uniform sample of many), not the output's sample
            yield "selected.near_duplicate_pairs_within", pairs["within"]
            yield "selected.near_duplicate_pairs_across", pairs["across"]
        sample = summary.get("sample") or {}
        yield "sample_rows", sample.get("rows")
        for name, values in (summary.get("objective") or {}).items():
            for key in ("objective", "quality", "diversity", "near_duplicate_pairs"):
                yield f"{name}.{key}", values.get(key)
        yield "summary_seconds", summary.get("seconds")
        for name, seconds in run.phases.items():
            yield f"phase.{name}", seconds
        for name, seconds in run.stages.items():
            yield f"stage.{name}", seconds
        yield "datamask-dask", run.versions.get("datamask-dask")


def _cell(value):
    return json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else value

