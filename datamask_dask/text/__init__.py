"""From raw text to the columns a selection needs: embeddings and quality scores, per partition.

    out = (ddf.pipe(embed, text_column="text")
              .pipe(score_quality, text_column="text")
              .pipe(datamask_select, ratio=0.1))

Sits beside :mod:`datamask_dask.ops` (it may use ops and the rooms below, never the reverse).
Needs the ``text`` extra (sentence-transformers and the packaged all-MiniLM-L6-v2 weights) for
:func:`embed` and model scorers; the heuristic scorer needs only pandas and pyarrow.
"""

from __future__ import annotations

__all__ = ["embed", "score_quality", "heuristic_scores", "load_count"]


def __getattr__(name):
    if name == "embed":
        from .embed import embed

        return embed
    if name in ("score_quality", "heuristic_scores"):
        from . import quality

        return getattr(quality, name)
    if name == "load_count":
        from ._common import load_count

        return load_count
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
