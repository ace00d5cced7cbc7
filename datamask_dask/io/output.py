"""Where an output lands, safely: guards, one writer at a time, a run record, an atomic publish.

Rules every writer of the package follows (``write_selection``, ``write_parquet``, the CLI):

- **The input is never touched.** The output may not be the input, contain it, or lie inside it
  (:func:`check_target` with ``inputs=``).
- **Only our own outputs are replaced.** With ``overwrite``, an existing target is replaced only
  when a previous datamask run wrote it, recognised by its run record: ``_datamask_run.json``
  inside a directory output, listing every file the run wrote, or the ``datamask.run`` key in the
  footer of a single-file output. Anything else (a user's directory, a file the record does not
  list, a symlink, a parquet file of other origin) is refused with a message that says what is there.
- **One run per output.** :func:`output_lock` holds an exclusive ``flock`` on a hidden sibling
  ``.OUT.datamask-lock``; a second run on the same output refuses instead of interleaving. The
  lock dies with its process, so a killed run never leaves a stale lock behind.
- **All or nothing.** The output is built in a hidden staging sibling and renamed into place
  (:func:`publish`); a replaced output is renamed aside first and removed only after the new one
  is in place.

Paths the package creates are all hidden siblings of the target (``.OUT.*``); nothing else is
ever removed.

On object stores (``s3://``..., see :mod:`.storage`) there is no rename and no ``flock``, so the
same rules rest on what they do give: the lock is an object created only if absent (S3
``If-None-Match``) naming its owner, with an expiry the run renews, taken over only once expired
or once its process on this machine is gone; and an output is complete when its run record
exists, written last, after every file it lists (:func:`publish_objects`).
A replaced output loses its record first, so it is never seen as complete with files of two runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import threading
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq

from ..errors import DataMaskError
from .storage import Location, resolve

RUN_RECORD = "_datamask_run.json"  # a leading underscore: parquet readers skip it
RECORD_KEY = "datamask.run"  # a single file's footer key, a Delta commit's or Iceberg snapshot's property
FOOTER_KEY = RECORD_KEY.encode()
MANIFEST = "manifest.json"  # of a run's work area (:mod:`datamask_dask.run.work`)


class UnsafeOutputError(DataMaskError):
    """The output would overwrite the input, someone else's data, or a run in progress."""


def check_target(target: str | os.PathLike, *, overwrite: bool, inputs=(),
                 flag: str = "--overwrite (overwrite=True)") -> None:
    """Refuse an output that would lose data; return quietly when writing it is safe.

    Parameters
    ----------
    target : path
        The output file or directory.
    overwrite : bool
        Whether an existing output of a previous datamask run may be replaced.
    inputs : iterable of path
        The job's input locations: the output may not be, contain or lie inside any of them.
    flag : str
        How the caller spells the overwrite switch, for messages (``--overwrite`` in the CLI).

    Raises
    ------
    UnsafeOutputError
        The output overlaps an input, or exists and was not written by datamask.
    FileExistsError
        The output exists and ``overwrite`` is False.
    """
    location = resolve(target)
    if not location.local:
        return _check_remote_target(location, overwrite=overwrite, inputs=inputs, flag=flag)
    target = Path(location.path)
    check_inputs(target, inputs)
    if os.path.lexists(target):
        _refuse_replacing(target, overwrite, flag, _not_ours)


def _refuse_replacing(target, overwrite: bool, flag: str, not_ours) -> None:
    """An existing output is replaced only with ``overwrite``, and only if datamask wrote it
    (``not_ours(target)`` says what else it is, or None)."""
    if not overwrite:
        raise FileExistsError(f"{target} exists; pass {flag} to replace it (only an output of an earlier "
                              "datamask run is ever replaced)")
    problem = not_ours(target)
    if problem:
        raise UnsafeOutputError(f"{flag} refused: {target} {problem}. datamask replaces only outputs it "
                                "wrote itself (they carry a run record); move it away or choose another "
                                "output")


def check_inputs(target: str | os.PathLike, inputs) -> None:
    """Refuse an output that is, contains or lies inside one of the ``inputs`` (on the same filesystem)."""
    location = resolve(target)
    if not location.local:
        return _check_remote_inputs(location, inputs)
    target = Path(location.path)
    resolved = target.resolve()
    for source in inputs:
        if source is None or not resolve(source).local:
            continue
        source = Path(resolve(source).path).resolve()
        if resolved == source or source in resolved.parents or resolved in source.parents:
            relation = ("is the input" if resolved == source else "lies inside the input"
                        if source in resolved.parents else "contains the input")
            raise UnsafeOutputError(f"the output {target} {relation} {source}: write the selection somewhere "
                                    "else (the input is never modified or removed)")


def library_versions(*extra: str) -> dict:
    """Python's and the libraries' versions for a run record (``extra``: optional ones, None if absent)."""
    import platform

    from .. import __version__

    versions = {"python": platform.python_version(), "datamask-dask": __version__}
    for module in ("numpy", "pandas", "pyarrow", "dask", "distributed", "torch", *extra):
        try:
            versions[module] = getattr(__import__(module), "__version__", None)
        except ImportError:
            versions[module] = None
    return versions


def _not_ours(target: Path) -> str | None:
    """Why ``target`` is not a replaceable datamask output, or None when it is."""
    if target.is_symlink():
        return "is a symbolic link"
    if target.is_file():
        try:
            metadata = pq.read_schema(target).metadata or {}
        except Exception:  # not parquet at all
            return "is a file that is not parquet"
        return None if FOOTER_KEY in metadata else "is a parquet file without a datamask run record"
    if not target.is_dir():
        return "is not a regular file or directory"
    record = read_record(target)
    if record is None:
        entries = sorted(p.name for p in target.iterdir())
        shown = ", ".join(entries[:5]) + (" ..." if len(entries) > 5 else "")
        return f"is a directory without a datamask run record ({RUN_RECORD}); it holds: {shown or 'nothing'}"
    known = set(record.get("files", [])) | {RUN_RECORD}
    foreign = sorted(p.name for p in target.iterdir() if p.name not in known or p.is_dir() or p.is_symlink())
    if foreign:
        return (f"holds entries the datamask run did not write: {', '.join(foreign[:5])}"
                + (" ..." if len(foreign) > 5 else ""))
    return None


def read_record(path: str | os.PathLike) -> dict | None:
    """The run record of a datamask output (directory or single file, local or a URI), or None."""
    location = resolve(path)
    if not location.local:
        try:
            if location.isdir():
                record = json.loads(location.child(RUN_RECORD).read_bytes())
            else:
                record = json.loads((pq.read_schema(location.path, filesystem=location.fs).metadata or {})
                                    [FOOTER_KEY])
        except (OSError, KeyError, ValueError):
            return None
        return record if isinstance(record, dict) else None
    path = Path(location.path)
    try:
        if path.is_dir():
            record = json.loads((path / RUN_RECORD).read_text(encoding="utf-8"))
        else:
            record = json.loads((pq.read_schema(path).metadata or {})[FOOTER_KEY])
    except (OSError, KeyError, ValueError):
        return None
    return record if isinstance(record, dict) else None


@contextlib.contextmanager
def output_lock(target: str | os.PathLike):
    """Hold the exclusive lock of ``target`` for the ``with`` block; refuse if another run holds it."""
    location = resolve(target)
    if not location.local:
        with _lease(location):
            yield
        return
    target = Path(location.path)
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = target.parent / f".{target.name}.datamask-lock"
    while True:
        handle = open(lock, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise UnsafeOutputError(f"another datamask run is writing {target} ({holder}); wait for it to "
                                    "finish (two runs on one output would interleave)") from None
        # The lock file may have been removed by the run that held it before we locked it: lock again.
        try:
            if os.stat(lock).st_ino == os.fstat(handle.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        handle.close()
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {os.uname().nodename}")
        handle.flush()
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)  # ours: created (or taken over) under the lock
        handle.close()


def staging_path(target: Path, kind: str = "tmp") -> Path:
    """A fresh hidden sibling of ``target`` for building or moving aside (never a user's path)."""
    return target.parent / f".{target.name}.{kind}-{uuid.uuid4().hex}"


def publish(staging: Path, target: Path) -> None:
    """Rename the finished ``staging`` onto ``target``, replacing a checked earlier output."""
    if staging.is_file() and (target.is_file() or not os.path.lexists(target)) and not target.is_symlink():
        os.replace(staging, target)  # a file is replaced in one atomic rename
        return
    # A directory cannot be swapped in one rename: move the old one aside first, remove it after.
    old = staging_path(target, "old")
    if os.path.lexists(target):
        os.replace(target, old)
    os.replace(staging, target)
    remove_own(old)


def remove_own(path: Path) -> None:
    """Remove a path this package created (a staging, work or moved-aside sibling)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


# --------------------------------------------------------------------------- object stores

LEASE_SECONDS = 600  # an object-store lock not renewed for this long belongs to a dead run
_RENEW_EVERY = LEASE_SECONDS / 5


def work_location(target: Location) -> Location:
    """The work directory of a run writing to ``target``: a hidden sibling of it."""
    return target.sibling(f".{target.name}.datamask-work")


def lock_location(target: Location) -> Location:
    return target.sibling(f".{target.name}.datamask-lock")


def _lease_body(owner: dict) -> bytes:
    return json.dumps({**owner, "expires": time.time() + LEASE_SECONDS}).encode()


def _stale(held: dict) -> bool:
    """Whether a lock's run is over: its lease expired, or its process on this machine is gone."""
    if float(held.get("expires", 0)) <= time.time():
        return True
    if held.get("host") != socket.gethostname() or not isinstance(held.get("pid"), int):
        return False
    try:
        os.kill(held["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


@contextlib.contextmanager
def _lease(target: Location):
    """The lock of an object-store output: a create-only object naming its owner, with an expiry
    renewed while the run lasts, removed at its end. A stale one (its lease expired, or its process
    on this machine is gone) is taken over."""
    lock = lock_location(target)
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "run": uuid.uuid4().hex}
    for _ in range(2):
        try:
            lock.write_bytes(_lease_body(owner), create=True)
            break
        except FileExistsError:
            try:
                held = json.loads(lock.read_bytes())
            except (OSError, ValueError):
                held = {}
            if not _stale(held):
                raise UnsafeOutputError(
                    f"another datamask run is writing {target} (pid {held.get('pid')} on {held.get('host')}; "
                    f"its lock {lock} expires in {float(held['expires']) - time.time():.0f} s unless "
                    "renewed); wait for it to finish (two runs on one output would interleave)") from None
            lock.remove()
    else:
        raise UnsafeOutputError(f"could not take the lock {lock} of {target}: another run took it first")
    stop = threading.Event()

    def renew():
        while not stop.wait(_RENEW_EVERY):
            with contextlib.suppress(Exception):  # a missed renewal is retried; the lease outlasts several
                lock.write_bytes(_lease_body(owner))

    renewer = threading.Thread(target=renew, name="datamask-lock-renewal", daemon=True)
    renewer.start()
    try:
        yield
    finally:
        stop.set()
        renewer.join()
        with contextlib.suppress(Exception):
            if json.loads(lock.read_bytes()).get("run") == owner["run"]:
                lock.remove()


def _check_remote_inputs(target: Location, inputs) -> None:
    for source in inputs:
        if source is None:
            continue
        source = resolve(source)
        if type(source.fs) is not type(target.fs):
            continue
        out, src = target.path.rstrip("/"), source.path.rstrip("/")
        relation = ("is the input" if out == src else "lies inside the input" if out.startswith(src + "/")
                    else "contains the input" if src.startswith(out + "/") else None)
        if relation:
            raise UnsafeOutputError(f"the output {target} {relation} {source}: write the selection somewhere "
                                    "else (the input is never modified or removed)")


def _check_remote_target(target: Location, *, overwrite: bool, inputs, flag: str) -> None:
    _check_remote_inputs(target, inputs)
    if committing(target) is not None:  # our own interrupted commit: the run resumes it
        return
    if target.exists():
        _refuse_replacing(target, overwrite, flag, _remote_not_ours)


def _remote_not_ours(target: Location) -> str | None:
    if target.isfile():
        try:
            metadata = pq.read_schema(target.path, filesystem=target.fs).metadata or {}
        except Exception:
            return "is a file that is not parquet"
        return None if FOOTER_KEY in metadata else "is a parquet file without a datamask run record"
    record = read_record(target)
    entries = target.files()
    if record is None:
        shown = ", ".join(entries[:5]) + (" ..." if len(entries) > 5 else "")
        return f"is a directory without a datamask run record ({RUN_RECORD}); it holds: {shown or 'nothing'}"
    known = set(record.get("files", [])) | {RUN_RECORD}
    foreign = [name for name in entries if name not in known]
    if foreign:
        return (f"holds entries the datamask run did not write: {', '.join(foreign[:5])}"
                + (" ..." if len(foreign) > 5 else ""))
    return None


def committing(target: Location) -> dict | None:
    """The commit an interrupted run had started into ``target`` (object stores), or None.

    Its work directory's manifest then lists the files the old output had (``old``) and those
    of the new one (``new``): the only names a resumed commit may remove or write.
    """
    try:
        manifest = json.loads(work_location(target).child(MANIFEST).read_bytes())
    except (OSError, ValueError):
        return None
    commit = manifest.get("commit") if isinstance(manifest, dict) else None
    return commit if isinstance(commit, dict) else None


def publish_objects(target: Location, names: list[str], write, record: dict, *, pending: dict | None = None,
                    remember=None, default=None) -> None:
    """Replace the directory output ``target`` on an object store by the files ``names``.

    ``write()`` writes them; the run record, listing them, is written last and is what makes the
    output complete. An earlier output's record goes first, then the files it listed that are not
    among ``names``: nothing else in ``target`` is ever removed. ``remember(commit)`` is called
    with the old and new names before anything changes (``pending``: such a commit, to finish).
    ``default`` serialises what JSON does not know in ``record`` (as ``json.dumps``'s).
    """
    if pending is not None:
        old = pending["old"]
    else:
        old = (read_record(target) or {}).get("files", []) if target.exists() else []
    if remember is not None:
        remember({"old": old, "new": names})
    target.child(RUN_RECORD).remove()  # from here on the output is not complete
    for name in sorted(set(old) - set(names)):
        target.child(name).remove()
    write()
    text = json.dumps({**record, "files": names}, indent=1, sort_keys=True, default=default)
    target.child(RUN_RECORD).write_bytes(text.encode())
