"""Task names the Dask dashboard and the profiles show: our steps under names that say what they do.

Apart from the progress bars (:mod:`datamask_dask.progress`) and the stage clocks
(:mod:`datamask_dask.telemetry`): naming changes no result and never fails a job.
"""

from __future__ import annotations

import dask


def named(parts: list, name: str) -> list:
    """The partitions' tasks (``collection.to_delayed()``: one graph) under the key name ``name``.

    Dask names a fused task after the first word of each layer it fuses ("datamask-_to_string_dtype-
    datamask-<token>" for our read, Dask's string conversion and our step): the dashboard shows
    what the task does instead. Naming is cosmetic, so it never fails a job: a task that cannot be
    renamed (a legacy tuple task or a plain key, as graphs from ``dd.concat`` or ``repartition``
    may hold) keeps Dask's name.
    """
    from dask.base import tokenize
    from dask.delayed import Delayed
    from dask.highlevelgraph import HighLevelGraph

    graph = dict(parts[0].__dask_graph__()) if parts else {}  # every part shares one graph
    keys = []
    for part in parts:
        key = part.key
        try:
            new_key = (f"{name}-{key[0].rsplit('-', 1)[-1]}", key[1])  # the token stays
            graph[new_key] = graph[key].substitute({}, key=new_key)
        except Exception:  # not a renamable task: keep Dask's key
            new_key = key
        # The old key stays: another part may depend on it (or be it), and compute culls it otherwise.
        keys.append(new_key)
    layer = f"{name}-{tokenize(*keys)}"  # graphs merge by layer name: one per set of parts
    layers = HighLevelGraph({layer: graph}, {layer: set()})
    return [Delayed(key, layers, layer=layer) for key in keys]


def named_task(name: str, function, *args, nout: int | None = None):
    """``function(*args)`` as a Delayed the dashboard shows as ``name`` (its task prefix), its key
    unique per function and arguments."""
    from dask.base import tokenize

    return dask.delayed(function, pure=True, nout=nout)(
        *args, dask_key_name=f"{name}-{tokenize(function.__name__, *args)}")


def listed(name: str, items: list):
    """The Delayed ``items`` as one Delayed list (shown as ``name``), to pass to a delayed call. A
    Python list of Delayed arguments makes dask copy each item's whole culled graph into a layer of
    its own: quadratic where the items share a graph, as every partition's summary shares the
    near-duplicate search. Passed one by one, each is a reference, and each shared layer is kept
    once."""
    return named_task(name, _as_list, *items)


def _as_list(*items) -> list:
    return list(items)
