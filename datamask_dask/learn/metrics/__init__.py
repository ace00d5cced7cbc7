"""Diversity metrics: the interface (:mod:`.base`), one module per built-in metric, the registry that
names them and the objective of a selection (:mod:`.evaluate`).

A metric is an object with four methods (see :class:`DiversityMetric`); users register their own
with :func:`register_metric`, and ``algorithm={"Facility": 0.7, "DiSF": 0.3}`` combines several.
"""

from .base import EVERY_ROW, DiversityMetric, MetricSettings, Represented
from .disf import DiSF, TableMoments
from .evaluate import (
    evaluate_selection,
    normalise_quality,
    weighted_diversity,
    weighted_diversity_both,
)
from .facility import Facility, FacilityState
from .pair_simi import PairSimi
from .registry import build_metrics, register_metric, registered_metric, resolve_metrics

__all__ = ["EVERY_ROW", "DiSF", "DiversityMetric", "Facility", "FacilityState", "MetricSettings", "PairSimi",
           "Represented", "TableMoments", "build_metrics", "evaluate_selection", "normalise_quality",
           "register_metric", "registered_metric", "resolve_metrics", "weighted_diversity",
           "weighted_diversity_both"]
