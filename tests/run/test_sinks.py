"""Every sink keeps the run protocol's promises, on local disk and on a real S3 API server.

- A run interrupted after some partitions finished resumes from them, and gives what an
  uninterrupted run gives: the same bytes for parquet, the same rows in one commit for Delta and
  Iceberg.
- An existing output is refused without ``overwrite`` / ``mode``; an output another run holds is
  refused at once.
- Nothing is left beside the output once it is committed.
"""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from conftest import FAST, require_lakehouse

deltalake = require_lakehouse()

import datamask_dask  # noqa: E402
from datamask_dask.dask_engine import runs  # noqa: E402
from datamask_dask.io.output import UnsafeOutputError, output_lock  # noqa: E402
from datamask_dask.io.storage import resolve  # noqa: E402
from datamask_dask.io.tables import parse_table_uri, read_table  # noqa: E402
from datamask_dask.run.tables import open_sink, select_table  # noqa: E402

SINKS = ["parquet directory", "parquet file", "delta", "iceberg", "selection only"]
OPTIONS = {**FAST, "ratio": 0.1, "seed": 3}


class Case:
    """One sink on one storage: where its outputs go, how a run writes one, how it is read back."""

    def __init__(self, sink: str, root: str, catalog: dict | None, storage_options: dict | None):
        self.sink, self.root, self.catalog, self.storage_options = sink, root, catalog, storage_options

    def uri(self, name: str) -> str:
        if self.sink == "parquet file":
            return f"{self.root}/{name}.parquet"
        if self.sink in ("delta", "selection only"):
            return f"delta://{self.root}/{name}" if "://" not in self.root else f"delta+{self.root}/{name}"
        if self.sink == "iceberg":
            return f"iceberg://cat/ns.{name}"
        return f"{self.root}/{name}"

    def run(self, source, name: str, *, again: bool = False, scheduler="sync") -> dict:
        options = {**OPTIONS, "scheduler": scheduler}
        if self.sink == "parquet file":
            frame = datamask_dask.read_parquet(source)
            report = datamask_dask.write_selection(frame, self.uri(name), single_file=True, overwrite=again,
                                                   storage_options=self.storage_options, **options)
            return report.record
        columns = "selection" if self.sink == "selection only" else "all"
        mode = "overwrite" if again else "error"
        report = select_table(str(source), self.uri(name), output_columns=columns, mode=mode,
                              catalog_properties=self.catalog, **options)
        return report.record

    def location(self, name: str):
        table = parse_table_uri(self.uri(name))
        return open_sink(table, mode="overwrite", catalog_properties=self.catalog,
                         storage_options=self.storage_options).location

    def rows(self, name: str) -> pa.Table:
        """The output's rows, in id order."""
        uri = self.uri(name)
        if self.sink == "parquet file" or self.sink == "parquet directory":
            frame = datamask_dask.read_parquet(uri, storage_options=self.storage_options).compute()
            table = pa.Table.from_pandas(frame, preserve_index=False)
        else:
            frame = read_table(uri, catalog_properties=self.catalog).frame.compute()
            frame = frame.drop(columns=["run_id"], errors="ignore")  # each run's own id
            table = pa.Table.from_pandas(frame, preserve_index=False)
        return table.replace_schema_metadata(None).sort_by("chunk_id")

    def data_bytes(self, name: str) -> dict:
        """Parquet outputs: each data file's bytes (a single file's footer holds its run record)."""
        location = resolve(self.uri(name), self.storage_options)
        if self.sink == "parquet file":
            import pyarrow.parquet as pq

            handle = location.path if location.local else location.fs.open(location.path, "rb")
            return {"rows": pq.read_table(handle).replace_schema_metadata(None)}
        return {n: location.child(n).read_bytes() for n in location.list() if n.endswith(".parquet")}

    def published(self, name: str) -> bool:
        """Whether readers see an output (table data files that belong to no version do not count)."""
        if self.sink == "iceberg":
            from datamask_dask.io.iceberg import get_catalog

            return get_catalog("cat", **self.catalog).table_exists(f"ns.{name}")
        if self.sink.startswith("parquet"):
            return resolve(self.uri(name), self.storage_options).exists()
        return deltalake.DeltaTable.is_deltatable(parse_table_uri(self.uri(name)).location)

    def commits(self, name: str) -> int:
        if self.sink == "iceberg":
            from datamask_dask.io.iceberg import get_catalog

            return len(get_catalog("cat", **self.catalog).load_table(f"ns.{name}").snapshots())
        uri = parse_table_uri(self.uri(name)).location
        return len(deltalake.DeltaTable(uri).history())


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.slow)])  # the S3 server: slow
def storage(request, tmp_path):
    """Where outputs go: a local folder, or a fresh prefix of the S3 server's bucket."""
    if request.param == "local":
        return str(tmp_path / "out"), None
    s3 = request.getfixturevalue("s3")
    return f"s3://lake/sinks-{uuid.uuid4().hex[:8]}", s3


@pytest.fixture(params=SINKS)
def case(request, storage, tmp_path) -> Case:
    root, s3 = storage
    catalog = None
    if request.param == "iceberg":
        from pyiceberg.catalog.sql import SqlCatalog

        warehouse = f"{root}/warehouse" if s3 else f"file://{tmp_path}/warehouse"
        catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": warehouse}
        if s3:
            catalog.update({"s3.endpoint": s3["endpoint_url"], "s3.access-key-id": "testing",
                            "s3.secret-access-key": "testing", "s3.region": "us-east-1"})
        SqlCatalog("cat", **{k: v for k, v in catalog.items() if k != "type"}).create_namespace("ns")
    return Case(request.param, root, catalog, s3)


def _patch_tasks(monkeypatch, order: list, fail: int | None = None) -> None:
    """Note the order the partitions' tasks run in; partition ``fail``'s task fails."""
    select = runs._select_part

    def task(frame, plan, part, write, *rest):
        order.append(part)
        if part == fail:
            raise RuntimeError(f"partition {part} lost")
        return select(frame, plan, part, write, *rest)

    monkeypatch.setattr(runs, "_select_part", task)


def _assert_as_uninterrupted(case: Case) -> None:
    """``out`` is ``reference``: the same bytes for parquet, the same rows in one commit for a table;
    nothing is left beside the outputs."""
    assert case.rows("out").equals(case.rows("reference"))
    if case.sink.startswith("parquet"):
        assert case.data_bytes("out") == case.data_bytes("reference")
    else:
        assert case.commits("out") == 1
    assert _left_beside(case) == []


def _left_beside(case: Case) -> list[str]:
    """What the package left next to the outputs (hidden work areas, locks, staging)."""
    parent = resolve(case.root, case.storage_options)
    if case.sink == "iceberg":
        parent = resolve(f"{case.catalog['warehouse']}/ns.db", case.storage_options)
    return sorted(name for name in parent.list() if name.startswith("."))


def test_an_interrupted_run_resumes_to_the_uninterrupted_output(case, parquet_dir, monkeypatch):
    order = []
    _patch_tasks(monkeypatch, order)
    reference = case.run(parquet_dir, "reference")
    assert reference["computed"] == [0, 1, 2, 3] and sorted(order) == [0, 1, 2, 3]
    last = order[-1]  # the sync scheduler runs one task at a time: those before the failure finish
    interrupted = []
    _patch_tasks(monkeypatch, interrupted, fail=last)
    with pytest.raises(RuntimeError, match=f"partition {last} lost"):
        case.run(parquet_dir, "out")
    monkeypatch.undo()
    assert not case.published("out")
    finished = sorted(set(interrupted) - {last})
    assert finished  # something is left to reuse
    resumed = case.run(parquet_dir, "out")
    assert (resumed["reused"], resumed["computed"]) == (finished, sorted({0, 1, 2, 3} - set(finished)))
    _assert_as_uninterrupted(case)


def test_an_existing_or_busy_output_is_refused(case, parquet_dir):
    case.run(parquet_dir, "out")
    with pytest.raises(FileExistsError):
        case.run(parquet_dir, "out")
    with output_lock(case.location("out")):
        with pytest.raises(UnsafeOutputError, match="another datamask run is writing"):
            case.run(parquet_dir, "out", again=True)
    again = case.run(parquet_dir, "out", again=True)  # ours, replaced (or appended to) on request
    assert again["rows"] == 1600 and _left_beside(case) == []


@pytest.fixture
def cluster(s3):
    """Two worker processes under nannies: a killed worker comes back, and its tasks run again. They
    start once the S3 server's settings are in the environment, which they inherit."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                      memory_limit="2GiB") as local, Client(local, set_as_default=False) as client:
        yield client


@pytest.mark.slow
def test_a_killed_worker_leaves_the_uninterrupted_output(case, parquet_dir, cluster):
    """A worker dies (SIGKILL) while its partition is being selected, after another partition was
    written: Dask runs its tasks again, and the output is the uninterrupted run's."""
    import os
    import signal
    import threading
    import time

    reference = case.run(parquet_dir, "reference", scheduler=cluster)
    pids = cluster.run(os.getpid)
    killed: dict = {}
    before = set(cluster.run_on_scheduler(lambda dask_scheduler: [str(key) for key in dask_scheduler.tasks]))

    def written(dask_scheduler) -> bool:  # a part is written (with its marker) once its task is done
        return any("datamask-select-write" in str(key) and str(key) not in before and task.state == "memory"
                   for key, task in dask_scheduler.tasks.items())

    def kill_a_busy_worker():
        # the scheduler's state, not a listing of the work area: a listing on a loaded machine can
        # take longer than the last parts' tasks
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            busy = [address for address, keys in cluster.processing().items()
                    if address in pids and any("datamask-select-write" in str(key) for key in keys)]
            if busy and cluster.run_on_scheduler(written):
                killed.update(pid=pids[busy[0]], published=case.published("out"))
                os.kill(pids[busy[0]], signal.SIGKILL)
                return
            time.sleep(0.005)

    killer = threading.Thread(target=kill_a_busy_worker, daemon=True)
    killer.start()
    record = case.run(parquet_dir, "out", scheduler=cluster)
    killer.join()
    assert killed and not killed["published"]
    cluster.wait_for_workers(2, timeout=60)
    assert record["selected"] == reference["selected"] and record["computed"] == [0, 1, 2, 3]
    _assert_as_uninterrupted(case)
