"""A run's work area: what an interrupted run leaves for the next one to reuse.

Every run, whatever its engine and its sink, keeps its work in a hidden sibling of its output
until the output is committed (its layout and names: :mod:`datamask_dask.io.staging`).

- **Markers.** A task writes its data, then its sample, then its marker, each whole
  (:meth:`~datamask_dask.io.storage.Location.write_bytes`; fsynced on local disk), so a marker only
  ever names complete data. A task that runs twice writes the same bytes again: the selection is
  deterministic.
- **Resume.** A run on the same output with the same identity reuses every partition whose marker
  is valid (same run id, the planned row count, the sink still holds its data) and computes the
  others. A different identity refuses with a :class:`ResumeError` that names what changed.
- The area is removed once the output is committed (and, when a run fails before any partition
  finished, at once).
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid

import pandas as pd
import pyarrow as pa

from ..errors import DataMaskError
from ..io.parquet import parquet_file, to_arrow, write_table
from ..io.pieces import to_pandas
from ..io.records import dumps
from ..io.staging import MANIFEST, Staging, read_manifest, work_location
from ..io.storage import Location

FORMAT = 2  # version of the work area's layout
_OUTPUT_KEYS = {"after": "newest datamask run in it"}  # how a changed output key reads in a message
_HINT = "pass resume=False (--no-resume) to discard its finished partitions and start again"


class ResumeError(DataMaskError):
    """An unfinished run's work area does not match this run (options, input or output changed)."""


@dataclasses.dataclass(frozen=True)
class WorkArea(Staging):
    """The work area of run ``run_id`` (picklable: tasks write their markers into it)."""

    # ------------------------------------------------------------------ task side

    def mark(self, number: int, marker: dict, sample: pd.DataFrame) -> None:
        """Record partition ``number`` as finished: its sample for the summary, then its marker."""
        with self.part(number, ".sample.parquet").open_write() as handle:
            write_table(to_arrow(sample), handle)
        self.part(number, ".json").write_bytes(dumps({**marker, "run_id": self.run_id}).encode())

    def sample(self, number: int) -> pd.DataFrame:
        """Partition ``number``'s rows sampled for the run summary, as its task wrote them."""
        return to_pandas(parquet_file(self.part(number, ".sample.parquet")).read())

    # ------------------------------------------------------------------ driver side

    def finished(self, rows: list[int], holds) -> dict[int, dict]:
        """``{partition: marker}`` of the partitions with a valid marker (``holds(descriptor)``: the
        sink still has that partition's data). Each marker's ``sample`` is read back as a frame."""
        present, done = set(self.location.list()), {}
        for number, n_rows in enumerate(rows):
            marker_file = self.part(number, ".json")
            if marker_file.name not in present:
                continue
            try:
                marker = json.loads(marker_file.read_bytes())
                if marker.get("run_id") != self.run_id or marker.get("rows") != n_rows:
                    continue
                if marker.get("written") is not None and not holds(marker["written"]):
                    continue
                marker["sample"] = self.sample(number)
            except (OSError, ValueError, KeyError, pa.ArrowException):
                continue
            done[number] = marker
        return done

    def any_finished(self) -> bool:
        return any(name.endswith(".json") and name != MANIFEST for name in self.location.list())


def open_work(target: Location, identity: dict, *, resume: bool, committed: str | None,
              defaults: dict) -> tuple[WorkArea, dict]:
    """The work area of a run on ``target`` with ``identity``, and its manifest.

    An unfinished run with the same identity is resumed (unless ``resume`` is False); one whose run
    id is ``committed`` (the output's newest run) had committed and only lost its area, which is
    started afresh. ``defaults``: the built-in settings, which a setting missing from an older
    manifest had.
    """
    location = work_location(target)
    manifest = read_manifest(location)
    pending = manifest is not None and manifest.get("commit") is not None  # an object-store commit to finish
    if manifest is not None and (resume or pending) and manifest.get("run_id") != committed:
        if manifest.get("format") != FORMAT:
            raise ResumeError(f"an unfinished run on {target} was started by an earlier version of "
                              f"datamask-dask (its work area {location} has layout {manifest.get('format')}, "
                              f"this version reads {FORMAT}): {_HINT}, or write to another output.")
        _check_same_run(manifest, identity, defaults, target, location)
    else:
        location.remove()  # ours: a stale area, one without a manifest, or resume=False
        location.makedirs()
        manifest = {**identity, "format": FORMAT, "run_id": uuid.uuid4().hex, "runs": []}
    return WorkArea(location, manifest["run_id"]), manifest


def _check_same_run(manifest: dict, identity: dict, defaults: dict, target: Location,
                    location: Location) -> None:
    """Refuse to resume into a run started with other options, on another input or for another output."""
    hint = f"Run again with the original options and input to resume, {_HINT} in {location}, or write to " \
           f"another output than {target}."
    old, new = manifest.get("settings", {}), identity["settings"]
    changed = sorted(k for k in set(old) | set(new)
                     if old.get(k, defaults.get(k)) != new.get(k, defaults.get(k)))
    if changed:
        shown = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in changed[:8])
        raise ResumeError(f"cannot resume the unfinished run on {target}: it was started with other "
                          f"options ({shown}). {hint}")
    old, new = manifest.get("input", {}), identity["input"]
    changed = [k for k in new if old.get(k) != new.get(k)]
    if changed:
        raise ResumeError(f"cannot resume the unfinished run on {target}: the input changed since it "
                          f"started (different {', '.join(changed)}). {hint}")
    old, new = manifest.get("output", {}), identity["output"]
    changed = [_OUTPUT_KEYS.get(k, k) for k in new if old.get(k) != new.get(k)]
    if changed:
        raise ResumeError(f"cannot resume the unfinished run on {target}: its output changed since it "
                          f"started (different {', '.join(changed)}). {hint}")
    if manifest.get("plan") != identity["plan"]:
        raise ResumeError(f"cannot resume the unfinished run on {target}: the quota plan differs from the "
                          f"one it started with although options and input match. {hint}")


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


