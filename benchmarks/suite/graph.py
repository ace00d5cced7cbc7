"""The plan pass's Dask graph: tasks and layer entries, counted when the graph is built (no timing, no
compute), for each wiring of the near-duplicate search (``datamask_dask.dedup``) a cluster runs: in one
task (20 partitions), task to task and by DataFrame shuffles (60 partitions, the wiring forced)."""

from __future__ import annotations

from . import data

WIRINGS = {"one task, 20 partitions": (20, None), "task to task, 60 partitions": (60, 10**9),
           "shuffles, 60 partitions": (60, 0)}
SHAPE = data.SHAPES["PlanGraph"]


class PlanGraph:
    params = (list(WIRINGS),)
    param_names = ["wiring"]
    timeout = 300

    def setup(self, wiring):
        from datamask_dask.dask_engine.operator import plan_selection
        from datamask_dask.dedup import dask_graph

        partitions, limit = WIRINGS[wiring]
        before = dask_graph.SHUFFLE_PARTITIONS, dask_graph.LOCAL_ONE_TASK
        if limit is not None:
            dask_graph.SHUFFLE_PARTITIONS = limit
        dask_graph.LOCAL_ONE_TASK = False  # the graphs a cluster runs, built without one
        try:
            rows = partitions * SHAPE["rows a partition"]
            plan = plan_selection(data.frame(rows, SHAPE["dim"], partitions), 0.1)[1]
            self.layers = [set(layer.keys()) for layer in plan.__dask_graph__().layers.values()]
        finally:
            dask_graph.SHUFFLE_PARTITIONS, dask_graph.LOCAL_ONE_TASK = before

    def track_tasks(self, wiring):
        return len(set().union(*self.layers))

    track_tasks.unit = "tasks"

    def track_layer_entries(self, wiring):
        """Keys over every layer: above ``tasks`` when a layer repeats another's keys."""
        return sum(len(keys) for keys in self.layers)

    track_layer_entries.unit = "keys"
