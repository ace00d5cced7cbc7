"""The metrics by name: ``algorithm="Facility"`` (any alias, any case), a mapping of weights, or a
:class:`~.base.DiversityMetric`; users add theirs with :func:`register_metric`."""

from __future__ import annotations

from collections.abc import Mapping

from ...errors import OptionError
from .base import DiversityMetric, MetricSettings
from .disf import DiSF
from .facility import Facility
from .pair_simi import PairSimi

_REGISTRY: dict[str, type[DiversityMetric] | DiversityMetric] = {}


def register_metric(name: str, metric: type[DiversityMetric] | DiversityMetric) -> None:
    """Make ``algorithm=name`` (case-insensitive) use ``metric`` (a class or an instance)."""
    _REGISTRY[name.lower()] = metric


for _cls, _aliases in ((PairSimi, ("pair_simi", "pairsimi", "pair", "pairwise")),
                       (Facility, ("facility", "facility_location", "fl")),
                       (DiSF, ("disf",))):
    for _alias in _aliases:
        register_metric(_alias, _cls)


def registered_metric(name: str) -> type[DiversityMetric] | DiversityMetric:
    """What ``algorithm=name`` uses (the same object for every alias of a metric)."""
    key = resolve_metrics(name)[0][0]
    return _REGISTRY[key] if isinstance(key, str) else key


def _metric_names() -> list[str]:
    """The registered metrics under their own names (aliases left out)."""
    return sorted({getattr(m, "name", None) or key for key, m in _REGISTRY.items()}, key=str.lower)


def _suggest(name) -> str:
    import difflib

    close = difflib.get_close_matches(str(name).lower(), list(_REGISTRY), n=1, cutoff=0.6)
    if not close:
        return ""
    metric = _REGISTRY[close[0]]
    return f"did you mean {getattr(metric, 'name', None) or close[0]!r}? "


def resolve_metrics(algorithm) -> list[tuple[str | DiversityMetric, float]]:
    """Normalise ``algorithm`` to a list of (metric, weight), weights summing to 1.

    A metric is a registered name (case-insensitive) or a :class:`DiversityMetric` instance or
    subclass; pass objects rather than names for metrics defined in a notebook, so they travel
    to Dask workers with the options.
    """
    items = algorithm.items() if isinstance(algorithm, Mapping) else [(algorithm, 1.0)]
    out = []
    for name, weight in items:
        if isinstance(name, DiversityMetric) or isinstance(name, type) and issubclass(name, DiversityMetric):
            key = name
        elif isinstance(name, str) and name.lower() in _REGISTRY:
            key = name.lower()
        else:
            raise OptionError(f"option algorithm={name!r} is unknown: {_suggest(name)}use one of "
                              f"{_metric_names()}, a DiversityMetric, or a mapping {{metric: weight}}")
        if isinstance(weight, bool) or not (isinstance(weight, int | float) and weight > 0):
            raise OptionError(f"option algorithm: weight of {name!r} must be > 0, got {weight!r}")
        out.append((key, float(weight)))
    if not out:
        raise OptionError("option algorithm is empty: name at least one metric")
    total = sum(w for _, w in out)
    return [(n, w / total) for n, w in out]


def build_metrics(metric_weights,
                  settings: MetricSettings | None = None) -> list[tuple[DiversityMetric, float]]:
    """Instantiate the resolved metrics: a class with the learner's ``settings`` (None: its own
    defaults, where only :meth:`~DiversityMetric.evaluate` is wanted, which they do not change); an
    instance as it is."""
    out = []
    for key, weight in metric_weights:
        metric = _REGISTRY[key] if isinstance(key, str) else key
        if isinstance(metric, type):
            metric = metric() if settings is None else metric.from_settings(settings)
        out.append((metric, weight))
    return out
