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
exists, written last, after every file it lists (:class:`~.sinks.ParquetSink`).
A replaced output loses its record first, so it is never seen as complete with files of two runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import threading
import time
import uuid
from pathlib import Path

from ..errors import REPLACE_OUTPUT, DataMaskError
from .commit_journal import pending_commit
from .parquet import parquet_file
from .storage import Location, reach, resolve, storage_errors

RUN_RECORD = "_datamask_run.json"  # a leading underscore: parquet readers skip it
RECORD_KEY = "datamask.run"  # a single file's footer key, a Delta commit's or Iceberg snapshot's property
FOOTER_KEY = RECORD_KEY.encode()


class UnsafeOutputError(DataMaskError):
    """The output would overwrite the input, someone else's data, or a run in progress."""


def check_target(target: str | os.PathLike, *, overwrite: bool, inputs=(),
                 flag: str = REPLACE_OUTPUT) -> None:
    """Refuse an output that would lose data; return quietly when writing it is safe.

    ``overwrite``: whether an existing output of a previous datamask run may be replaced; ``inputs``:
    the job's input locations, which ``target`` may not be, contain or lie inside; ``flag``: how the
    caller spells the overwrite switch, for messages (``--overwrite`` in the CLI).

    Raises
    ------
    UnsafeOutputError
        The output overlaps an input, or exists and was not written by datamask.
    FileExistsError
        The output exists and ``overwrite`` is False.
    StorageError
        The output's object store cannot be reached, refuses the credentials, or has no such bucket.
    """
    location = resolve(target)
    check_inputs(location, inputs)
    with storage_errors(location):  # the job's first contact with the output
        if not location.local and pending_commit(location) is not None:  # our own interrupted commit: resumed
            return
        if not reach(location) or _empty_directory(location):  # nothing there that could be lost
            return
        problem = _not_ours(location)
    shown = location.path if location.local else location
    if problem:  # said before the flag is asked for, which would then be refused
        said = f"{flag} refused: {shown} {problem}" if overwrite else f"{shown} exists and {problem}"
        raise UnsafeOutputError(f"{said}. datamask replaces only outputs it wrote itself (they carry a run "
                                "record); move it away or choose another output")
    if not overwrite:
        raise FileExistsError(f"{shown} exists; pass {flag} to replace it (an output of an earlier datamask "
                              "run)")


def check_inputs(target: str | os.PathLike, inputs) -> None:
    """Refuse an output that is, contains or lies inside one of the ``inputs`` on its filesystem (on
    local disk, through symbolic links)."""
    location = resolve(target)
    for source in inputs:
        source = None if source is None else resolve(source)
        if source is None or type(source.fs) is not type(location.fs):
            continue
        if location.local:
            out, src = os.path.realpath(location.path), os.path.realpath(source.path)
        else:
            out, src = location.path.rstrip("/"), source.path.rstrip("/")
        inside, contains = out.startswith(src.rstrip("/") + "/"), src.startswith(out.rstrip("/") + "/")
        relation = ("is the input" if out == src else "lies inside the input" if inside
                    else "contains the input" if contains else None)
        if relation:
            output, source = (location.path, src) if location.local else (location, source)
            raise UnsafeOutputError(f"the output {output} {relation} {source}: write the selection somewhere "
                                    "else (the input is never modified or removed)")


def library_versions(*extra: str) -> dict:
    """Python's and the libraries' versions for a run record (``extra``: optional ones, None if absent)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    from .. import __version__

    versions = {"python": platform.python_version(), "datamask-dask": __version__}
    for module in ("numpy", "pandas", "pyarrow", "dask", "distributed", "torch", *extra):
        if module in sys.modules:
            versions[module] = getattr(sys.modules[module], "__version__", None)
            continue
        try:  # a library the job did not load is not imported for its version (seconds, for distributed)
            versions[module] = version(module.replace("_", "-"))
        except PackageNotFoundError:
            versions[module] = None
    return versions


def _not_ours(target: Location) -> str | None:
    """Why ``target`` is not a replaceable datamask output, or None when it is."""
    if target.local and os.path.islink(target.path):
        return "is a symbolic link"
    if target.isfile():
        try:
            metadata = parquet_file(target).schema_arrow.metadata or {}
        except Exception:  # not parquet at all
            return "is a file that is not parquet"
        return None if FOOTER_KEY in metadata else "is a parquet file without a datamask run record"
    if target.local and not target.isdir():
        return "is not a regular file or directory"
    record = read_record(target)
    entries = target.list() if target.local else target.files()  # on a store: every file under it
    if record is None:
        shown = ", ".join(entries[:5]) + (" ..." if len(entries) > 5 else "")
        return f"is a directory without a datamask run record ({RUN_RECORD}); it holds: {shown or 'nothing'}"
    known = set(record.get("files", [])) | {RUN_RECORD}
    foreign = [name for name in entries if name not in known or _nested(target.child(name))]
    if foreign:
        return (f"holds entries the datamask run did not write: {', '.join(foreign[:5])}"
                + (" ..." if len(foreign) > 5 else ""))
    return None


def _empty_directory(target: Location) -> bool:
    """A local directory with nothing in it (made ahead of the run): written into as if absent."""
    return target.local and not os.path.islink(target.path) and target.isdir() and not target.list()


def _nested(entry: Location) -> bool:
    """A directory or a link inside a local output: a datamask run writes neither."""
    return entry.local and (os.path.isdir(entry.path) or os.path.islink(entry.path))


def read_record(path: str | os.PathLike) -> dict | None:
    """The run record of a datamask output (directory or single file, local or a URI), or None."""
    location = resolve(path)
    try:
        if location.isdir():
            record = json.loads(location.child(RUN_RECORD).read_bytes())
        else:
            record = json.loads((parquet_file(location).schema_arrow.metadata or {})[FOOTER_KEY])
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
        with contextlib.suppress(FileNotFoundError):
            if os.stat(lock).st_ino == os.fstat(handle.fileno()).st_ino:
                break
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
    resolve(old).remove()


# --------------------------------------------------------------------------- object stores

LEASE_SECONDS = 600  # an object-store lock not renewed for this long belongs to a dead run
_RENEW_EVERY = LEASE_SECONDS / 5


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
            with storage_errors(target, writing=True):  # the output's first write: read-only fails here
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
