"""From raw text to the columns a selection needs: embeddings and quality scores, per partition.

    out = (ddf.pipe(embed, text_column="text")
              .pipe(score_quality, text_column="text")
              .pipe(datamask_select, ratio=0.1))

Needs the ``text`` extra (sentence-transformers and the packaged all-MiniLM-L6-v2 weights) for
:func:`embed` and model scorers; the heuristic scorer needs only pandas and pyarrow.
"""

from __future__ import annotations

from ._common import load_count
from .embedding import embed
from .quality import heuristic_scores, score_quality

__all__ = ["embed", "score_quality", "heuristic_scores", "load_count"]
