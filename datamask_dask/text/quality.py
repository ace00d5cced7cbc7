"""``score_quality``: a quality column from a text column, per partition, lazily.

Scorers:

``"heuristic"`` (default)
    Web-text rules of Gopher (Rae et al. 2021) and FineWeb (Penedo et al. 2024) turned into soft
    scores, computed per partition with pyarrow.compute and pandas vector operations (no Python
    loop per document): word count, mean word length, symbol-to-word ratio (``#``, ``...``),
    share of words with a letter, stop-word ratio, duplicate-line fraction, repeated word 3-gram
    fraction, share of lines ending in punctuation and share of short lines. Each signal maps to
    [0, 1] (1: passes the rule comfortably, 0: fails it clearly); the score, in [0, 1], is the
    length score times the weighted geometric mean of the others (each floored at 0.05).
a callable
    ``f(list of str) -> array-like`` of one finite number per text.
a path
    A local Hugging Face sequence-classification model directory (as FineWeb-Edu's classifier is
    used): one label gives its logit (a regression score), several the probability of the last
    label. Loaded once per worker process.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InputDataError, OptionError
from ..options import TEXT_COLUMN
from ._common import cached_model, check_text_meta, partition_name, resolve_device, text_values

#: Common English function words (Gopher's eight first); prose has ~30-50% of them, code and lists few.
STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with", "a", "an", "in", "is", "it", "for",
              "on", "as", "was", "are", "this", "by", "not", "or", "at", "from", "but", "which", "can",
              "you", "we", "they", "he", "she", "his", "her", "their", "its", "been", "has", "had",
              "will", "would", "there", "if", "so", "all", "more", "when", "what", "who", "into")
_STOP_RE = r"\b(?:" + "|".join(STOP_WORDS) + r")\b"
#: Weights of the signals averaged after the length score.
WEIGHTS = {"word_length": 1.0, "symbols": 1.0, "alpha_words": 1.0, "stop_words": 2.0, "duplicate_lines": 1.5,
           "repeated_ngrams": 1.5, "line_punctuation": 1.0, "short_lines": 1.0}
#: Lowest value a signal's score counts with in the geometric mean.
FLOOR = 0.05
#: Words per document looked at for n-gram repetition (bounds the cost of very long documents).
NGRAM_WORDS = 2000


def _ramp_down(x, good, bad):
    """1 at or below ``good``, 0 at or above ``bad``, linear between."""
    return np.clip((bad - x) / (bad - good), 0.0, 1.0)


def _per_doc(parents: np.ndarray, n: int, weights=None) -> np.ndarray:
    return np.bincount(parents, weights=weights, minlength=n).astype(np.float64)


def heuristic_signals(texts) -> pd.DataFrame:
    """The raw signals of each text (one row per text): counts and fractions, no scoring."""
    arr = pa.array(pd.Series(texts, dtype="string[pyarrow]"), type=pa.large_string())
    if isinstance(arr, pa.ChunkedArray):  # a Series of several Arrow chunks
        arr = arr.combine_chunks()
    n = len(arr)
    chars = pc.utf8_length(arr).to_numpy(zero_copy_only=False).astype(np.float64)
    lower = pc.utf8_lower(arr)
    n_words = pc.count_substring_regex(arr, r"\S+").to_numpy(zero_copy_only=False).astype(np.float64)
    spaces = pc.count_substring_regex(arr, r"\s").to_numpy(zero_copy_only=False)
    safe_words = np.maximum(n_words, 1.0)
    symbols = pc.count_substring_regex(arr, r"#|\.\.\.|…").to_numpy(zero_copy_only=False)
    alpha = pc.count_substring_regex(arr, r"\S*[A-Za-z\x{00C0}-\x{024F}]\S*").to_numpy(zero_copy_only=False)
    stops = pc.count_substring_regex(lower, _STOP_RE).to_numpy(zero_copy_only=False)

    # Lines: duplicates within the document, ending punctuation, short lines.
    lines = pc.split_pattern(arr, "\n")
    line_doc = pc.list_parent_indices(lines).to_numpy()
    flat = pc.utf8_trim_whitespace(pc.list_flatten(lines))
    keep = pc.greater(pc.utf8_length(flat), 0).to_numpy(zero_copy_only=False)
    line_doc, flat = line_doc[keep], flat.filter(pa.array(keep))
    n_lines = _per_doc(line_doc, n)
    dup_line = pd.DataFrame({"d": line_doc, "l": flat.to_pandas(types_mapper=pd.ArrowDtype)}).duplicated()
    dup_lines = _per_doc(line_doc[dup_line.to_numpy()], n)
    punct = pc.match_substring_regex(flat, r"[.!?:;\"'”’)]$").to_numpy(zero_copy_only=False)
    short = pc.less(pc.utf8_length(flat), 30).to_numpy(zero_copy_only=False)
    safe_lines = np.maximum(n_lines, 1.0)

    # Word 3-grams repeated within the document (first NGRAM_WORDS words).
    words = pc.list_slice(pc.split_pattern_regex(pc.utf8_trim_whitespace(lower), r"\s+"), 0, NGRAM_WORDS)
    word_doc = pc.list_parent_indices(words).to_numpy()
    w = pc.list_flatten(words)
    same = word_doc[:-2] == word_doc[2:]  # the gram's three words are of one document
    gram = pc.binary_join_element_wise(w[:-2], w[1:-1], w[2:], pa.scalar(" ", pa.large_string()))
    gram_doc = word_doc[:-2][same]
    gram = gram.filter(pa.array(same))
    repeated = pd.DataFrame({"d": gram_doc, "g": gram.to_pandas(types_mapper=pd.ArrowDtype)}).duplicated()
    n_grams = _per_doc(gram_doc, n)
    rep_grams = _per_doc(gram_doc[repeated.to_numpy()], n)
    return pd.DataFrame({
        "chars": chars,
        "words": n_words,
        "mean_word_length": (chars - spaces) / safe_words,
        "symbol_ratio": symbols / safe_words,
        "alpha_word_fraction": alpha / safe_words,
        "stop_word_ratio": stops / safe_words,
        "lines": n_lines,
        "duplicate_line_fraction": dup_lines / safe_lines,
        "repeated_ngram_fraction": rep_grams / np.maximum(n_grams, 1.0),
        "line_punctuation_fraction": _per_doc(line_doc, n, punct) / safe_lines,
        "short_line_fraction": _per_doc(line_doc, n, short) / safe_lines,
    })


def heuristic_scores(texts) -> np.ndarray:
    """Quality in [0, 1] of each text from :func:`heuristic_signals` (see the module doc)."""
    s = heuristic_signals(texts)
    words = s["words"].to_numpy()
    length = np.clip(np.log(np.maximum(words, 1) / 5.0) / np.log(80 / 5.0), 0.0, 1.0)
    length = np.where(words > 100_000, 0.5 * length, length)
    mwl = s["mean_word_length"].to_numpy()
    parts = {
        "word_length": np.clip(1.0 - np.maximum(3.0 - mwl, mwl - 10.0) / 2.0, 0.0, 1.0),
        "symbols": _ramp_down(s["symbol_ratio"].to_numpy(), 0.02, 0.2),
        "alpha_words": np.clip((s["alpha_word_fraction"].to_numpy() - 0.4) / 0.4, 0.0, 1.0),
        "stop_words": np.clip(s["stop_word_ratio"].to_numpy() / 0.25, 0.0, 1.0),
        "duplicate_lines": _ramp_down(s["duplicate_line_fraction"].to_numpy(), 0.05, 0.4),
        "repeated_ngrams": _ramp_down(s["repeated_ngram_fraction"].to_numpy(), 0.1, 0.5),
        "line_punctuation": np.clip(s["line_punctuation_fraction"].to_numpy() / 0.3, 0.0, 1.0),
        "short_lines": _ramp_down(s["short_line_fraction"].to_numpy(), 0.5, 0.95),
    }
    total = sum(WEIGHTS.values())
    # Weighted geometric mean (floored at FLOOR): one clearly failed rule pulls the score down,
    # as a failed Gopher/FineWeb filter would drop the document, but not to zero.
    log_mean = sum(WEIGHTS[k] * np.log(np.maximum(v, FLOOR)) for k, v in parts.items()) / total
    return np.clip(length * np.exp(log_mean), 0.0, 1.0)


# ---------------------------------------------------------------- model scorers

def _load_classifier(path: str, device: str):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True).to(device).eval()
    return tokenizer, model


def classifier_scores(texts: list[str], path: str, *, device: str = "auto", batch_size: int = 32,
                      max_tokens: int = 512) -> np.ndarray:
    """Scores of a local sequence-classification model: the logit (one label) or P(last label)."""
    import torch

    dev = resolve_device(device)
    tokenizer, model = cached_model(("classifier", str(path), dev), lambda: _load_classifier(str(path), dev))
    limit = min(max_tokens, getattr(model.config, "max_position_embeddings", max_tokens) or max_tokens)
    out = np.empty(len(texts), dtype=np.float64)
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            feats = tokenizer(texts[start:start + batch_size], max_length=limit, truncation=True,
                              padding=True, return_tensors="pt").to(dev)
            logits = model(**feats).logits.float()
            vals = logits[:, 0] if logits.shape[1] == 1 else torch.softmax(logits, dim=1)[:, -1]
            out[start:start + len(vals)] = vals.cpu().numpy()
    return out


def _resolve_scorer(scorer):
    if callable(scorer):
        return "callable", scorer
    if scorer == "heuristic":
        return "heuristic", None
    path = Path(str(scorer)).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        return "classifier", str(path.resolve())
    raise OptionError(f"scorer must be 'heuristic', a callable or a local Hugging Face "
                      f"sequence-classification model directory, got {scorer!r}")


def _score_partition(part: pd.DataFrame, text_column: str, output_column: str, kind: str, scorer,
                     batch_size: int, device: str, max_tokens: int, tasks: int = 1, partition_info=None):
    where = partition_name(partition_info)
    text = text_values(part, text_column, where, "score_quality")
    if kind == "heuristic":
        values = heuristic_scores(text)
    elif kind == "classifier":
        from ..threads import torch_threads
        from ._common import task_threads

        with torch_threads(task_threads(tasks), resolve_device(device)):
            values = classifier_scores(text.tolist(), scorer, device=device, batch_size=batch_size,
                                       max_tokens=max_tokens)
    else:
        values = np.asarray(scorer(text.tolist()), dtype=np.float64).reshape(-1)
        if len(values) != len(text):
            raise InputDataError(f"score_quality: the scorer returned {len(values)} values for the "
                                 f"{len(text)} texts of column {text_column!r}, {where}")
        if not np.isfinite(values).all():
            rows = [int(i) for i in np.flatnonzero(~np.isfinite(values))[:5]]
            raise InputDataError(f"score_quality: the scorer returned NaN or infinite scores for column "
                                 f"{text_column!r}, {where}, first at rows {rows}")
    out = part.copy()
    out[output_column] = pd.Series(values, index=part.index, dtype="float64")
    return out


def score_quality(ddf, text_column: str = TEXT_COLUMN, scorer="heuristic",
                  output_column: str = "quality_score", batch_size: int = 32, device: str = "auto",
                  max_tokens: int = 512):
    """Add a float64 quality column computed from ``text_column``, lazily (see the module doc).

    Parameters
    ----------
    ddf : dask.dataframe.DataFrame
    text_column : str, default "text"
        Non-empty strings (null, non-string or empty text: InputDataError naming column and partition).
    scorer : "heuristic", callable or path, default "heuristic"
    output_column : str, default "quality_score"
        The name :func:`~datamask_dask.datamask_select` reads quality from by default; several
        quality columns combine by weights there (``quality_column={"a": 0.7, "b": 0.3}``).
    batch_size, device, max_tokens
        For a model directory scorer only (which runs torch on each task's share of the CPU cores,
        as :func:`~datamask_dask.text.embed` does).
    """
    kind, resolved = _resolve_scorer(scorer)
    check_text_meta(ddf, text_column, output_column, "score_quality")
    if device not in (None, "auto"):
        resolve_device(device)
    meta = ddf._meta.assign(**{output_column: pd.Series([], dtype="float64", index=ddf._meta.index[:0])})
    return ddf.map_partitions(_score_partition, text_column, output_column, kind, resolved, int(batch_size),
                              device, int(max_tokens), ddf.npartitions, meta=meta)
