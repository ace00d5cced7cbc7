"""The learner on one chunk: quality scores and unit embeddings in, an exact-size mask out.

torch and numpy only: no pandas, Dask, pyarrow or cuDF is imported here or below, so a Spark
executor or a GPU worker that needs only the learner pays for nothing else.

- :mod:`.engine`: :func:`learn_mask`, the policy-gradient mask learner (DATAMASK and its fixes)
- :mod:`.metrics`: the diversity metrics (Pair_simi, Facility, DiSF, user metrics), their registry and
  the objective of a selection
- :mod:`.knn`: Facility's sparse neighbour graph (exact or clustered)
- :mod:`.options`: :class:`DataMaskOptions`, the reference tool's option names
- :mod:`.baselines`: random, quality top-k, greedy, lazy and stochastic greedy, DiSF batched greedy
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "engine": ["MaskResult", "learn_mask"],
    "metrics": ["DiversityMetric", "evaluate_selection", "register_metric"],
    "options": ["DataMaskOptions"],
})
