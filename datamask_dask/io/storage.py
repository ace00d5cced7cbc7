"""Every path the package reads or writes, as a URI resolved once to a filesystem.

``resolve("s3://lake/corpus/", storage_options)`` gives a :class:`Location`: an fsspec filesystem
and the path on it. Local paths, ``file://``, ``s3://``, ``gs://``, ``abfs://``, ``hf://``... all
go through it, so no URI is ever taken apart with :mod:`pathlib` (which turns ``s3://b/k`` into a
local ``s3:/b/k``). Credentials and endpoints come from ``storage_options`` (the Python API) or the
filesystem's usual environment variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``...: the CLI).

Writes follow what each kind of storage guarantees:

- **Local disk**: a temporary sibling, fsynced, renamed into place (:meth:`Location.write_bytes`).
- **Object stores**: one PUT is visible all at once and there is no rename, so an object is written
  in one go to its final name; ``create=True`` writes only if no object has that name (S3's
  ``If-None-Match``, fsspec's ``mode="create"``), which is what locks and completion markers need.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import posixpath
import shutil
import uuid

import fsspec
from fsspec.implementations.local import LocalFileSystem

from ..errors import OptionError

#: fsspec protocol -> the package that implements it (for the install hint).
_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "abfs": "adlfs", "az": "adlfs",
             "abfss": "adlfs", "hf": "huggingface_hub", "hdfs": "pyarrow"}


@dataclasses.dataclass(frozen=True)
class Location:
    """A file or directory: ``fs`` (an fsspec filesystem), ``path`` on it, ``uri`` as the user wrote it."""

    fs: fsspec.AbstractFileSystem
    path: str
    uri: str

    def __str__(self) -> str:
        return self.uri

    def __fspath__(self) -> str:
        if not self.local:
            raise TypeError(f"{self.uri} is not a local path")
        return self.path

    @property
    def local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    @property
    def name(self) -> str:
        return posixpath.basename(self.path.rstrip("/"))

    @property
    def parent(self) -> Location:
        path = posixpath.dirname(self.path.rstrip("/"))
        uri = self.uri.rstrip("/")
        return Location(self.fs, path, uri[: len(uri) - len(self.name)].rstrip("/") or path)

    def child(self, name: str) -> Location:
        """``name`` (a relative POSIX path) inside this directory."""
        return Location(self.fs, f"{self.path.rstrip('/')}/{name}", f"{self.uri.rstrip('/')}/{name}")

    def sibling(self, name: str) -> Location:
        return self.parent.child(name)

    # -------------------------------------------------------------------- reading

    def exists(self) -> bool:
        if self.local:
            return os.path.lexists(self.path)
        return self.fs.exists(self.path)

    def isdir(self) -> bool:
        return self.fs.isdir(self.path)

    def isfile(self) -> bool:
        return self.fs.isfile(self.path)

    def size(self) -> int:
        return int(self.fs.size(self.path))

    def read_bytes(self) -> bytes:
        return self.fs.cat_file(self.path)

    def list(self) -> list[str]:
        """Names of the entries directly inside this directory (none when it does not exist)."""
        try:
            entries = self.fs.ls(self.path, detail=False, refresh=True) if not self.local else \
                os.listdir(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return []
        finally:
            if not self.local:  # other processes write here: a cached listing would hide their files
                self.fs.invalidate_cache(self.path)
        return sorted(posixpath.basename(str(e).rstrip("/")) for e in entries)

    def files(self) -> list[str]:
        """Relative POSIX paths of every file under this directory (or its own name for a file)."""
        if self.isfile():
            return [self.name]
        root = self.path.rstrip("/") + "/"
        found = self.fs.find(self.path, withdirs=False)
        return sorted(str(f)[len(root):] if str(f).startswith(root) else str(f) for f in found)

    # -------------------------------------------------------------------- writing

    def write_bytes(self, data: bytes, *, create: bool = False) -> None:
        """Write ``data`` whole: readers see the old object or the new one, never a part.

        ``create``: only if nothing has this name yet (raises :class:`FileExistsError` otherwise).
        """
        with self.open_write(create=create) as handle:
            handle.write(data)

    @contextlib.contextmanager
    def open_write(self, *, create: bool = False):
        """A binary handle whose contents appear under this name, whole, when the block ends without error."""
        if not self.local:
            self.fs.makedirs(self.parent.path, exist_ok=True)
            with self.fs.open(self.path, "xb" if create else "wb") as handle:
                yield handle
            return
        os.makedirs(self.parent.path, exist_ok=True)
        temporary = f"{self.path}.tmp-{uuid.uuid4().hex}"
        try:
            with open(temporary, "wb") as handle:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())
            if create:
                os.link(temporary, self.path)  # fails with FileExistsError where the name is taken
            else:
                os.replace(temporary, self.path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
        fsync_dir(self.parent.path)

    def makedirs(self) -> None:
        self.fs.makedirs(self.path, exist_ok=True)

    def remove(self) -> None:
        """Remove this file or directory tree, if present (only ever called on the package's own paths)."""
        with contextlib.suppress(FileNotFoundError):
            if self.local:
                if os.path.isdir(self.path) and not os.path.islink(self.path):
                    shutil.rmtree(self.path, ignore_errors=True)
                elif os.path.lexists(self.path):
                    os.unlink(self.path)
            elif self.fs.exists(self.path):
                self.fs.rm(self.path, recursive=self.fs.isdir(self.path))

    def copy_to(self, destination: Location) -> None:
        """Copy this file to ``destination`` on the same filesystem (server-side on object stores)."""
        self.fs.copy(self.path, destination.path)


def resolve(uri, storage_options: dict | None = None) -> Location:
    """The :class:`Location` of ``uri`` (a local path, ``file://...``, ``s3://bucket/key``...).

    Raises
    ------
    OptionError
        The URI's filesystem is unknown or its package is not installed (the error names it).
    """
    if isinstance(uri, Location):
        return uri
    text = os.fspath(uri) if isinstance(uri, os.PathLike) else str(uri)
    protocol = text.split("://", 1)[0].lower() if "://" in text else "file"
    try:
        fs, path = fsspec.core.url_to_fs(text, **(storage_options or {}))
    except ImportError as exc:
        package = _PACKAGES.get(protocol, f"the fsspec implementation of {protocol}://")
        raise OptionError(f"{text}: reading or writing {protocol}:// needs {package}: "
                          f"pip install {package}") from exc
    except ValueError as exc:
        raise OptionError(f"{text}: {exc}") from exc
    if isinstance(fs, LocalFileSystem):
        path = os.path.abspath(path)
        if protocol == "file":
            text = text if "://" not in text else path
    return Location(fs, path, text)


def fsync_dir(path: str) -> None:
    """Make a directory entry durable (a rename or a new file in it)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def input_fingerprint(source) -> list:
    """Names, sizes and modification times (ETags on object stores) of the input's data files: a
    resume must see the same. Hidden files and folders (``.x``, ``_x``) are not data."""
    source = resolve(source)
    single = source.isfile()
    names = source.files()
    if not single:
        names = [n for n in names if not any(part.startswith((".", "_")) for part in n.split("/"))]
    fingerprint = []
    for name in names:
        where = source if single else source.child(name)
        if source.local:
            stat = os.stat(where.path)
            fingerprint.append([name, stat.st_size, stat.st_mtime_ns])
        else:
            info = source.fs.info(where.path)
            fingerprint.append([name, int(info.get("size") or 0),
                                str(info.get("ETag") or info.get("mtime") or info.get("LastModified"))])
    return fingerprint
