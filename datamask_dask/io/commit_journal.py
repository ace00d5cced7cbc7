"""The journal of a commit into an object store, where nothing can be renamed: before anything in the
target changes, the work area's manifest records the file names the old output had and those of the new
one, the only names the commit may remove or write. A run interrupted mid-commit is finished by the next
run on the same output, which reads them back here."""

from __future__ import annotations

from .staging import Staging, read_manifest, work_location
from .storage import Location


def pending_commit(target: Location) -> dict | None:
    """The commit an interrupted run had started into ``target`` (``{"old": [...], "new": [...]}``), or
    None."""
    commit = (read_manifest(work_location(target)) or {}).get("commit")
    return commit if isinstance(commit, dict) else None


def begin_commit(work: Staging, manifest: dict, old: list[str], new: list[str]) -> list[str]:
    """Record a commit replacing the files ``old`` with ``new``, unless one is pending, which is finished
    instead; the old names the commit must remove."""
    pending = manifest.get("commit")
    old = pending["old"] if pending is not None else old
    manifest["commit"] = {"old": old, "new": new}
    work.write_manifest(manifest)
    return old
