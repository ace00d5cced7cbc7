"""The quality gate: the default selection's share of the best baseline's gain over random, per metric and
lamb, on small fixed tables, against the shares recorded in ``benchmarks/results/quality-gate.json``.

It runs ``datamask_select`` with the built-in profile on threads (no timing: only the selections count),
so the same code and seed always give the same shares. ``--check`` exits 1 when any share falls more
than ``--tolerance`` (0.5 points) below its record; ``--update`` records the current shares (do that
in the commit that means to change them, and say why). The test suite runs ``--check``.

    python benchmarks/quality_gate.py --check
    python benchmarks/quality_gate.py --check --opt refine_epochs=1     # a planted regression: exit 1
    python benchmarks/quality_gate.py --update
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import dask.dataframe as dd
import numpy as np
import yaml

from datamask_dask import datamask_select
from datamask_dask.learn.yardstick import measure_all
from datamask_dask.partition.adapters import embedding_matrix
from datamask_dask.sample_data import make_corpus

RECORD = Path(__file__).resolve().parent / "results" / "quality-gate.json"
METRICS = ("Pair_simi", "Facility", "DiSF")
#: name: (rows, dim, clusters, partitions, metrics, options). The first: rows a partition above the
#: Facility k-NN graph's exact size. The second: the same table in 8 partitions of rows spread at random
#: that one chunk cannot hold together (a table of many pieces, as a production table is).
TABLES = {"8k-d32": (8_000, 32, 80, 2, METRICS, {}),
          "8k-d32 in 8 pieces": (8_000, 32, 80, 8, METRICS, {"max_chunk_rows": 1000})}
LAMBS = (0.0, 0.5)


def shares(changes: dict) -> dict[str, float]:
    """The default job's share of the baseline's gain on every table, metric and lamb. Tables of the same
    rows (cut into other partitions or pieces) are measured together: their references once for all."""
    out = {}
    for data in dict.fromkeys((rows, dim, clusters) for rows, dim, clusters, *_ in TABLES.values()):
        rows, dim, clusters = data
        corpus = make_corpus(rows, dim, seed=1, n_clusters=clusters)
        quality = corpus["quality_score"].to_numpy()
        embeddings = embedding_matrix(corpus["feature_arr"])
        tables = {name: table for name, table in TABLES.items() if table[:3] == data}
        for metric in METRICS:
            for lamb in LAMBS:
                names = [name for name, table in tables.items() if metric in table[4]]
                selections = [_selected(corpus, tables[name], metric, lamb, changes) for name in names]
                if not selections:
                    continue
                scores = measure_all(quality, embeddings, selections, algorithm=metric, lamb=lamb)
                for name, score in zip(names, scores, strict=True):
                    out[f"{name} {metric} lamb={lamb:g}"] = round(score.share, 5)
    return {case: out[case] for case in _cases()}  # the record's order: table, metric, lamb


def _selected(corpus, table: tuple, metric: str, lamb: float, changes: dict) -> np.ndarray:
    """The rows the default job selects of ``corpus`` cut into ``table``'s partitions, with its options."""
    partitions, options = table[3], table[5]
    ddf = dd.from_pandas(corpus, npartitions=partitions, sort=False)
    job = datamask_select(ddf, ratio=0.1, algorithm=metric, lamb=lamb, **{**options, **changes})
    return job["selected"].compute(scheduler="threads").to_numpy()


def _cases() -> list[str]:
    return [f"{name} {metric} lamb={lamb:g}" for name, table in TABLES.items() for metric in table[4]
            for lamb in LAMBS]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--check", action="store_true", help="exit 1 if a share fell below its record")
    action.add_argument("--update", action="store_true", help="record the current shares")
    parser.add_argument("--tolerance", type=float, default=0.005, help="a share's allowed drop (0.005)")
    parser.add_argument("--opt", action="append", default=[], help="key=value: an option of every job")
    args = parser.parse_args(argv)
    changes = {key: yaml.safe_load(value) for key, _, value in (item.partition("=") for item in args.opt)}
    current = shares(changes)
    if args.update:
        RECORD.parent.mkdir(parents=True, exist_ok=True)
        RECORD.write_text(json.dumps(current, indent=1) + "\n")
        print(f"recorded {len(current)} shares in {RECORD}")
        return 0
    recorded = json.loads(RECORD.read_text())
    failed = 0
    for case, share in current.items():
        before = recorded.get(case)
        drop = np.nan if before is None else before - share
        verdict = "new" if before is None else "FAIL" if drop > args.tolerance else "ok"
        failed += verdict == "FAIL"
        recorded_text = "" if before is None else f" (recorded {before:.2%})"
        print(f"{verdict:>4}  {case:<28} share {share:.2%}{recorded_text}")
    if failed:
        print(f"quality gate: {failed} share(s) fell more than {args.tolerance:.1%} below the record; fix "
              "the regression, or run --update in a commit that says why", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
