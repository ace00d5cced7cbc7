"""The near-duplicate step judged on real text: its shadowed rows against exact cosine similarity.

**Corpus** (:func:`corpus`): paragraphs of text already on this machine, where real near-duplicates
occur: the documentation, licence files and standard-library docstrings of ``examples/
text_pipeline.py``'s ``build_corpus``; the licence texts of ``/usr/share/common-licenses`` and the
``/usr/share/doc/*/copyright`` files; the LICENSE/COPYING/NOTICE files inside the project's
virtual environment; then docstrings of installed packages, until ``--docs`` paragraphs. Texts that
are equal once whitespace is collapsed are taken once (an exact copy is found by any method; the
near ones are the test). Embedded with the packaged all-MiniLM-L6-v2
(:func:`datamask_dask.text.embedding.encode`) and scored with the heuristic scorer ``datamask
score`` uses (:func:`datamask_dask.text.quality.heuristic_scores`); the embedded corpus is cached
in ``.benchmark-cache/`` under a hash of its texts.

**Truth** (exact cosine of the same unit embeddings, all pairs, in blocks): a row *truly has a
better near-duplicate* when some row that is better (higher quality, then lower row number: the
step's order) has cosine >= the threshold with it. A row's *true group* is its connected
component in the graph whose edges are the pairs at cosine >= the threshold; the *best row* of a
group is its best row in the step's order.

**Measures**, per threshold (the default ``duplicate_cosine`` and +-0.03):

- precision: the share of the rows the step sets aside (shadows) that truly have a better
  near-duplicate;
- recall: the share of the rows that truly have a better near-duplicate that the step sets aside;
- best kept: the share of true groups of two rows or more whose best row the step keeps;
- seconds: the step alone, the least of ``--repeat`` runs, on the partitions' inputs as the plan
  pass hands them over (embeddings included where the step reads them).

The step runs twice per threshold, as the one-task search (:func:`~datamask_dask.dedup.search.
find_groups`) and as the sharded stages (:func:`~datamask_dask.dedup.stages.find_groups_sharded`,
4 shards) on ``--partitions`` partitions; their groups must be identical (the script fails
otherwise). With ``--compare CHECKOUT`` the same is measured for the package of another checkout
(e.g. main) in a child process, interleaved run by run, so both sides see the same machine load.
``--semhash`` also times semhash's deduplication of the same embeddings where it is installed.

    python benchmarks/bench_near_duplicates_text.py --compare /work/main \\
        --json benchmarks/results/near-duplicates-text.json
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "examples"))
import record  # noqa: E402
import text_pipeline  # noqa: E402  (the corpus sources)

CACHE = ROOT / ".benchmark-cache"
DEFAULT_COSINE = 0.95
_LICENCE_NAMES = re.compile(r"^(LICEN[CS]E|COPYING|NOTICE)", re.I)
_PACKAGES = ("numpy", "pandas", "dask", "distributed", "pyarrow", "torch", "sklearn", "scipy")


def _sources():
    """(source, text) of every candidate document, in a fixed order."""
    frame = text_pipeline.build_corpus(n_docs=10**7, seed=0)
    yield from zip(frame["source"], frame["text"].astype(str), strict=True)
    files = sorted(glob.glob("/usr/share/common-licenses/*"))
    files += sorted(glob.glob("/usr/share/doc/*/copyright"))
    venv = Path(sys.prefix) / "lib"
    files += sorted(str(p) for p in venv.rglob("*") if p.is_file() and _LICENCE_NAMES.match(p.name)
                    and p.stat().st_size < 300_000)
    for path in files:
        for para in text_pipeline._paragraphs(Path(path).read_text(encoding="utf-8", errors="replace")):
            yield "licence", para
    site = Path(sys.prefix) / "lib"
    for package in _PACKAGES:
        for root in sorted(site.glob(f"python3*/site-packages/{package}")):
            for path in text_pipeline._walk(root, suffixes={".py"}):
                for doc in text_pipeline._docstrings(path):
                    for para in text_pipeline._paragraphs(doc):
                        yield f"docstring:{package}", para


def corpus_texts(n_docs: int) -> tuple[list[str], list[str]]:
    """Up to ``n_docs`` distinct paragraphs (texts, sources) from :func:`_sources`."""
    seen, texts, sources = set(), [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for source, text in _sources():
            key = " ".join(text.split())
            if key in seen:
                continue
            seen.add(key)
            texts.append(text)
            sources.append(source.split(":")[0])
            if len(texts) >= n_docs:
                break
    return texts, sources


def corpus(n_docs: int) -> dict:
    """The embedded corpus: texts, sources, unit embeddings (float32) and heuristic quality, cached
    under a hash of the texts."""
    from datamask_dask.text.quality import heuristic_scores

    texts, sources = corpus_texts(n_docs)
    digest = hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16]
    path = CACHE / f"near-duplicates-text-{digest}.npy"
    if path.exists():
        embeddings = np.load(path)
    else:
        from datamask_dask.text.embedding import encode

        started = time.perf_counter()
        embeddings = encode(texts, device="cpu")
        print(f"embedded {len(texts)} texts in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        CACHE.mkdir(exist_ok=True)
        np.save(path, embeddings)
    embeddings = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    quality = np.asarray(heuristic_scores(texts), dtype=np.float64)
    return {"texts": texts, "sources": sources, "embeddings": embeddings.astype(np.float32),
            "quality": quality, "digest": digest}


# --------------------------------------------------------------------------- truth


def order_rank(quality: np.ndarray) -> np.ndarray:
    """Each row's place in the step's order: 0 for the best (highest quality, then lowest row)."""
    n = quality.shape[0]
    rank = np.empty(n, dtype=np.int64)
    rank[np.lexsort((np.arange(n), -quality))] = np.arange(n)
    return rank


def exact_pairs(unit: np.ndarray, cosine: float, block: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """Every pair ``(i, j)``, ``i < j``, at exact cosine >= ``cosine`` (all pairs, in blocks)."""
    import torch

    x = torch.from_numpy(unit)
    left, right = [], []
    for start in range(0, unit.shape[0], block):
        sims = (x[start:start + block] @ x.T).numpy()
        i, j = np.nonzero(sims >= cosine)
        i = i + start
        keep = i < j
        left.append(i[keep])
        right.append(j[keep])
    return np.concatenate(left), np.concatenate(right)


def truth(unit: np.ndarray, quality: np.ndarray, cosine: float) -> dict:
    """Rows that truly have a better near-duplicate, and each true group's best row."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = unit.shape[0]
    rank = order_rank(quality)
    i, j = exact_pairs(unit, cosine)
    worse = np.where(rank[i] > rank[j], i, j)
    has_better = np.zeros(n, dtype=bool)
    has_better[worse] = True
    graph = coo_matrix((np.ones(i.size), (i, j)), shape=(n, n))
    _, label = connected_components(graph, directed=False)
    sizes = np.bincount(label)
    best = np.full(sizes.size, -1)
    by_rank = np.argsort(rank)
    first = np.unique(label[by_rank], return_index=True)[1]
    best[label[by_rank[first]]] = by_rank[first]
    return {"has_better": has_better, "best": best[sizes > 1], "pairs": int(i.size)}


def scores(shadowed: np.ndarray, true: dict) -> dict:
    """Precision, recall and best-kept share of a set of shadowed rows (global row numbers)."""
    mask = np.zeros(true["has_better"].shape[0], dtype=bool)
    mask[shadowed] = True
    hits = int(np.count_nonzero(mask & true["has_better"]))
    return {"shadowed": int(mask.sum()), "precision": hits / max(1, int(mask.sum())),
            "recall": hits / max(1, int(true["has_better"].sum())),
            "best_kept": float(np.mean(~mask[true["best"]])) if true["best"].size else 1.0}


# --------------------------------------------------------------------------- the step


def partitions(data: dict, n_parts: int, signatures: np.ndarray) -> list[dict]:
    """The plan pass's search inputs of ``n_parts`` contiguous partitions of the (shuffled) corpus."""
    bounds = np.linspace(0, signatures.shape[0], n_parts + 1).astype(int)
    return [{"quality": data["quality"][lo:hi], "codes": np.zeros(hi - lo, dtype=np.int64), "labels": [None],
             "signatures": signatures[lo:hi], "embeddings": data["embeddings"][lo:hi]}
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]


def shadowed_rows(groups: list, sizes: list[int]) -> np.ndarray:
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return np.concatenate([np.asarray(g.shadowed, dtype=np.int64) + offsets[i] for i, g in enumerate(groups)])


def measure_step(data: dict, cosines, n_parts: int, repeat: int) -> dict:
    """The package on ``sys.path``: per cosine, the shadowed rows of the one-task search and of the
    sharded stages (identical, or this fails) and each one's least seconds of ``repeat`` runs."""
    from datamask_dask.dedup import simhash
    from datamask_dask.dedup.search import find_groups
    from datamask_dask.dedup.stages import find_groups_sharded

    started = time.perf_counter()
    signatures = simhash.signatures(data["embeddings"], simhash.hyperplanes(data["embeddings"].shape[1]))
    sign_seconds = time.perf_counter() - started
    parts = partitions(data, n_parts, signatures)
    sizes = [len(p["quality"]) for p in parts]
    out = {"sign_seconds": sign_seconds, "cosines": {}}
    for cosine in cosines:
        times = {"one_task": [], "sharded": []}
        for _ in range(repeat):
            started = time.perf_counter()
            single = find_groups(parts, cosine)
            times["one_task"].append(time.perf_counter() - started)
            started = time.perf_counter()
            sharded, _ = find_groups_sharded(parts, cosine, shards=4)
            times["sharded"].append(time.perf_counter() - started)
        for one, other in zip(single, sharded, strict=True):
            for key in ("shadowed", "kept", "weights", "parent", "parents"):
                if not np.array_equal(getattr(one, key), getattr(other, key)):
                    raise SystemExit(f"one-task and sharded groups differ ({key}) at cosine {cosine}")
        out["cosines"][str(cosine)] = {"shadowed": shadowed_rows(single, sizes).tolist(),
                                       "one_task": min(times["one_task"]), "sharded": min(times["sharded"])}
    return out


def semhash_seconds(data: dict, cosine: float) -> dict | None:
    """semhash's self-deduplication of the same embeddings (its exact backend), records in the
    step's order, where semhash is importable: its seconds, version and the rows it drops."""
    try:
        from semhash import SemHash
    except ImportError:
        return None
    from importlib.metadata import version

    class Given:  # the corpus's own embeddings, in place of an encoder
        def encode(self, texts, **_):
            return data["embeddings"][[int(t.split(":", 1)[0]) for t in texts]]

    by_rank = np.argsort(order_rank(data["quality"]))
    records = [f"{i}:{data['texts'][i]}" for i in by_rank]
    started = time.perf_counter()
    engine = SemHash.from_records(records=records, model=Given(), use_ann=False)
    result = engine.self_deduplicate(threshold=cosine)
    seconds = time.perf_counter() - started
    texts = [d.record if isinstance(d.record, str) else d.record["text"] for d in result.duplicates]
    dropped = [int(t.split(":", 1)[0]) for t in texts]
    return {"seconds": seconds, "version": version("semhash"), "dropped": dropped}


# --------------------------------------------------------------------------- the run


def _worker(args) -> int:
    """``--worker``: measure the package on PYTHONPATH and write its results as JSON to stdout."""
    data = load(args)
    result = measure_step(data, thresholds(args.cosine), args.partitions, args.repeat)
    result["commit"] = record.commit(Path(args.tree)) if args.tree else record.commit()
    json.dump(result, sys.stdout)
    return 0


def thresholds(cosine: float) -> list[float]:
    """The default threshold and 0.03 either side."""
    return [round(cosine - 0.03, 4), cosine, round(cosine + 0.03, 4)]


def load(args) -> dict:
    """The corpus, shuffled (a fixed seed) so that near-copies fall in different partitions."""
    data = corpus(args.docs)
    order = np.random.default_rng(0).permutation(len(data["texts"]))
    return {"texts": [data["texts"][i] for i in order], "sources": [data["sources"][i] for i in order],
            "embeddings": np.ascontiguousarray(data["embeddings"][order]), "quality": data["quality"][order],
            "digest": data["digest"]}


def _child(tree: str, args) -> dict:
    """One run of ``--worker`` with ``tree``'s package."""
    # each side's own commit (a BENCH_COMMIT given to this run names this checkout only)
    env = {k: v for k, v in os.environ.items() if k != "BENCH_COMMIT"}
    env["PYTHONPATH"] = f"{tree}:{tree}/integrations"
    argv = [sys.executable, __file__, "--worker", "--docs", str(args.docs), "--cosine", str(args.cosine),
            "--partitions", str(args.partitions), "--repeat", "1", "--tree", tree]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"the run of {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=16_000, help="paragraphs in the corpus (at most)")
    parser.add_argument("--cosine", type=float, default=DEFAULT_COSINE)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each side (interleaved)")
    parser.add_argument("--compare", help="another checkout (e.g. /work/main), measured beside this one")
    parser.add_argument("--semhash", action="store_true", help="also time semhash, where installed")
    parser.add_argument("--json", help="append the results to this JSON file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args)
    data = load(args)
    cosines = thresholds(args.cosine)
    sides = {"this checkout": str(ROOT)} | ({"compared": args.compare} if args.compare else {})
    runs: dict = {name: [] for name in sides}
    for _ in range(args.repeat):  # interleaved: each side once a round, in separate processes
        for name, tree in sides.items():
            runs[name].append(_child(tree, args))
    truths = {c: truth(data["embeddings"], data["quality"], c) for c in cosines}
    lines = ["# Near-duplicates on real text: the step against exact cosine", ""]
    counts = {s: sum(1 for x in data["sources"] if x == s) for s in sorted(set(data["sources"]))}
    lines += [f"{len(data['texts'])} paragraphs ({', '.join(f'{v} {k}' for k, v in counts.items())}), "
              f"all-MiniLM-L6-v2 embeddings, heuristic quality, {args.partitions} partitions; "
              "seconds: the least of the runs:", ""]
    lines += ["| cosine | checkout | commit | rows with a better near-duplicate | set aside | precision "
              "| recall | best row of its true group kept | one-task seconds | sharded seconds |",
              "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for cosine in cosines:
        true = truths[cosine]
        for name, results in runs.items():
            found = results[0]["cosines"][str(cosine)]
            if any(r["cosines"][str(cosine)]["shadowed"] != found["shadowed"] for r in results):
                raise SystemExit(f"{name}: the runs set aside different rows at cosine {cosine}")
            got = scores(np.asarray(found["shadowed"], dtype=np.int64), true)
            one = min(r["cosines"][str(cosine)]["one_task"] for r in results)
            many = min(r["cosines"][str(cosine)]["sharded"] for r in results)
            label = Path(sides[name]).name if name == "compared" else "this"
            lines.append(f"| {cosine} | {label} | {results[0]['commit']} | {int(true['has_better'].sum())} | "
                         f"{got['shadowed']} | {100 * got['precision']:.1f}% | {100 * got['recall']:.1f}% | "
                         f"{100 * got['best_kept']:.1f}% | {one:.2f} | {many:.2f} |")
    if args.semhash:
        sem = semhash_seconds(data, args.cosine)
        if sem is not None:
            got = scores(np.asarray(sem["dropped"], dtype=np.int64), truths[args.cosine])
            lines += ["", f"semhash {sem['version']} (exact backend) at cosine {args.cosine}, the same "
                      "embeddings, records in quality order:", "",
                      "| seconds | set aside | precision | recall | best row of its true group kept |",
                      "|---:|---:|---:|---:|---:|",
                      f"| {sem['seconds']:.1f} | {got['shadowed']} | {100 * got['precision']:.1f}% | "
                      f"{100 * got['recall']:.1f}% | {100 * got['best_kept']:.1f}% |"]
    text = "\n".join(lines)
    print(text)
    if args.json:
        record.append(args.json, command=record.command("bench_near_duplicates_text.py", argv),
                      data={"corpus": {"paragraphs": len(data["texts"]), **counts}}, markdown=text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
