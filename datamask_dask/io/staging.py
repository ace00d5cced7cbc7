"""The hidden folder beside an output where a write keeps what it has not committed yet, and every name
in it. A selection run's is its work area (:class:`datamask_dask.run.work.WorkArea` adds its markers and
resume); it lives here, below the run, because the sinks write their parts into it::

    .OUT.datamask-work/
        manifest.json               the run's identity, run id, attempts, and an object-store commit's
                                    journal (:mod:`.commit_journal`)
        part-00042.json             partition 42 is finished (its marker)
        part-00042.sample.parquet   its rows sampled for the run summary
        part-00042.parquet          its data, where the sink keeps parts here (parquet outputs)
"""

from __future__ import annotations

import dataclasses
import json

from .records import dumps
from .storage import Location, resolve

MANIFEST = "manifest.json"


def work_location(target: Location) -> Location:
    """The work area of a run writing to ``target``: a hidden sibling of it."""
    return target.sibling(f".{target.name}.datamask-work")


def part_stem(number: int) -> str:
    """The name every file of partition ``number`` starts with in a staging folder."""
    return f"part-{number:05d}"


@dataclasses.dataclass(frozen=True)
class Staging:
    """A staging folder of run ``run_id`` (picklable: tasks write into it)."""

    location: Location
    run_id: str

    def child(self, name: str) -> Location:
        return self.location.child(name)

    def part(self, number: int, suffix: str) -> Location:
        """Partition ``number``'s file ending in ``suffix`` (``".json"``: its marker)."""
        return self.location.child(part_stem(number) + suffix)

    def write_manifest(self, manifest: dict) -> None:
        self.child(MANIFEST).write_bytes(dumps(manifest, indent=1).encode())

    def remove(self) -> None:
        self.location.remove()


def read_manifest(location) -> dict | None:
    """The manifest in a staging folder, or None when there is none or it is unreadable."""
    try:
        manifest = json.loads(resolve(location).child(MANIFEST).read_bytes())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def finished_parts(work: Location) -> int:
    """How many partitions a work area holds markers of (whatever run wrote them)."""
    return sum(name.startswith("part-") and name.endswith(".json") for name in work.list())
