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
  A missing bucket is never created: writing into one fails.

An object store that cannot be reached or refuses a request (no credentials, wrong ones, no
endpoint, no bucket, no permission) raises :class:`StorageError`, one line naming the URI and what
to set (:func:`storage_errors`, applied where a job first touches a location, and
:func:`storage_error` for the command line's late failures).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import posixpath
import re
import shutil
import uuid
from urllib.parse import urlsplit

import fsspec
from fsspec.implementations.local import LocalFileSystem

from ..errors import DataMaskError, OptionError, StorageError

#: fsspec protocol -> the package that implements it (for the install hint).
_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "abfs": "adlfs", "az": "adlfs",
             "abfss": "adlfs", "hf": "huggingface_hub", "hdfs": "pyarrow"}
#: Object stores of buckets (containers): no directories, and fsspec's makedirs there creates a bucket.
_BUCKET_STORES = {"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az"}


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
    def bucketed(self) -> bool:
        """On an object store of buckets (S3, GCS, Azure), where directories do not exist."""
        protocols = self.fs.protocol if isinstance(self.fs.protocol, (tuple, list)) else (self.fs.protocol,)
        return bool(_BUCKET_STORES.intersection(protocols))

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
            if not self.bucketed:
                self.fs.makedirs(self.parent.path, exist_ok=True)
            handle = self.fs.open(self.path, "xb" if create else "wb")
            try:
                yield handle
            except BaseException:
                # closing would publish what was written so far: abort instead (S3's multipart upload)
                if hasattr(handle, "discard"):
                    handle.discard()
                    handle.closed = True
                raise
            handle.close()
            return
        with self._replacing(create) as temporary, open(temporary, "wb") as handle:
            yield handle

    def write_with(self, write) -> None:
        """``write(where)`` fills this name whole, as :meth:`open_write`: ``where`` is a local file path
        on local disk (a native writer, such as cuDF's GPU one, then skips a Python file handle),
        else a binary handle."""
        if not self.local:
            with self.open_write() as handle:
                write(handle)
            return
        with self._replacing() as temporary:
            write(temporary)

    @contextlib.contextmanager
    def _replacing(self, create: bool = False):
        """A temporary local sibling to fill, fsynced and renamed onto this name when the block ends."""
        os.makedirs(self.parent.path, exist_ok=True)
        temporary = f"{self.path}.tmp-{uuid.uuid4().hex}"
        try:
            yield temporary
            fsync(temporary)
            if create:
                os.link(temporary, self.path)  # fails with FileExistsError where the name is taken
            else:
                os.replace(temporary, self.path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
        fsync(self.parent.path)

    def makedirs(self) -> None:
        if not self.bucketed:
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


def uri_text(uri) -> str:
    """A path or URI a user gave, as text. Several are refused: a run reads one input, which a resume
    lists again as it was."""
    if isinstance(uri, (list, tuple, set)):
        raise OptionError(f"a {type(uri).__name__} of paths was given where one path or URI is expected: "
                          "name the directory that holds the files, or read them with "
                          "dask.dataframe.read_parquet(paths) and select from that frame")
    return os.fspath(uri) if isinstance(uri, os.PathLike) else str(uri)


def resolve(uri, storage_options: dict | None = None) -> Location:
    """The :class:`Location` of ``uri`` (a local path, ``file://...``, ``s3://bucket/key``...).

    Raises
    ------
    OptionError
        The URI's filesystem is unknown or its package is not installed (the error names it).
    """
    if isinstance(uri, Location):
        return uri
    text = uri_text(uri)
    protocol = text.split("://", 1)[0].lower() if "://" in text else "file"
    try:
        fs, path = fsspec.core.url_to_fs(text, **(storage_options or {}))
    except ImportError as exc:
        package = _PACKAGES.get(protocol, f"the fsspec implementation of {protocol}://")
        raise OptionError(f"{text}: reading or writing {protocol}:// needs {package}: "
                          f"pip install {package}") from exc
    except ValueError as exc:
        if str(exc).startswith("Protocol not known"):
            raise OptionError(f"{text}: no filesystem is known for {protocol}:// (fsspec has none of that "
                              "name): give a local path or a URI such as s3://bucket/path") from exc
        raise OptionError(f"{text}: {exc}") from exc
    if isinstance(fs, LocalFileSystem):
        path = os.path.abspath(path)
        if protocol == "file":
            text = text if "://" not in text else path
    return Location(fs, path, text)


# S3 error codes -> what failed.
_REFUSED = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
            "TokenRefreshRequired", "InvalidClientTokenId", "UnrecognizedClientException"}
_DENIED = {"AccessDenied", "AllAccessDisabled", "AccountProblem", "403", "Forbidden"}
_MISSING_BUCKET = {"NoSuchBucket"}

_CREDENTIALS = ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment, or "
                "pass storage_options={'key': ..., 'secret': ...} in Python")
_ENDPOINT = ("set AWS_ENDPOINT_URL to the storage server's address (unset it for AWS S3 itself), or pass "
             "storage_options={'endpoint_url': ...} in Python")


def storage_error(exc: BaseException, where, *, writing: bool = False) -> StorageError | None:
    """``exc`` as one line naming ``where`` (a :class:`Location`, or a URI for the message alone), or
    None when it is not an object store's failure to reach or to allow a request (it is then raised
    as it is: a missing file stays ``FileNotFoundError``).

    Knows S3 (botocore's exceptions, and s3fs's ``OSError`` translations of them); a bare 403 (a HEAD
    has no body to say why) is asked again as a listing, whose error code tells wrong credentials
    from a missing permission.
    """
    if isinstance(exc, DataMaskError):
        return None
    try:
        from botocore import exceptions as boto
    except ImportError:  # the s3 extra is not installed: no S3 failure to explain
        return None
    uri = str(where)
    for error in _chain(exc):
        if isinstance(error, (boto.NoCredentialsError, boto.PartialCredentialsError, boto.ProfileNotFound,
                              boto.CredentialRetrievalError)):
            return StorageError(f"{uri}: no usable credentials for object storage ({error}): {_CREDENTIALS}",
                                "credentials")
        if isinstance(error, (boto.EndpointConnectionError, boto.ConnectTimeoutError,
                              boto.ConnectionClosedError, boto.ProxyConnectionError)):
            endpoint = _endpoint(getattr(error, "kwargs", {}).get("endpoint_url"))
            return StorageError(f"{uri}: cannot connect to the storage endpoint {endpoint or '(unknown)'}: "
                                f"{_ENDPOINT}", "endpoint")
        if isinstance(error, boto.ClientError):
            code = str(error.response.get("Error", {}).get("Code") or "")
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 403 and code in ("403", "Forbidden", "") and isinstance(where, Location):
                with contextlib.suppress(Exception):  # a HEAD's 403 does not say why: a listing does
                    code = _listing_code(where) or code
            return _client_error(where, code, status, writing)
    return None


def _client_error(where, code: str, status, writing: bool) -> StorageError | None:
    """The :class:`StorageError` of an S3 error ``code`` (HTTP ``status``), or None for another error."""
    if code in _REFUSED:
        return StorageError(f"{where}: the storage server refused the credentials ({code}): check "
                            f"{_CREDENTIALS.replace('set ', '', 1)}", "credentials")
    if code in _MISSING_BUCKET:
        bucket = _bucket(str(where))
        endpoint = _endpoint(_endpoint_of(where)) if isinstance(where, Location) else None
        at = f" at {endpoint}" if endpoint else ""
        return StorageError(f"{where}: the bucket {bucket} does not exist{at}: check the URI, create the "
                            "bucket, or set AWS_ENDPOINT_URL (storage_options={'endpoint_url': ...} in "
                            "Python) to the server that holds it", "bucket")
    if code in _DENIED or status == 403:
        action = "write" if writing else "read"
        return StorageError(f"{where}: permission denied to {action} ({code or status}): the credentials in "
                            "use (AWS_ACCESS_KEY_ID or AWS_PROFILE; storage_options key= in Python) may not "
                            f"{action} there: use credentials that may, or another location", "permission")
    return None


@contextlib.contextmanager
def storage_errors(location: Location, *, writing: bool = False):
    """Raise an object store's failures to reach or allow a request in the block as
    :class:`StorageError` naming ``location`` (``writing``: the block writes there); anything else
    passes unchanged."""
    try:
        yield
    except Exception as exc:
        error = storage_error(exc, location, writing=writing)
        if error is None:
            raise
        raise error from exc


def reach(location: Location) -> bool:
    """Whether ``location`` exists: a job's first contact with it. An object store's failures raise
    :class:`StorageError` (so does a missing bucket, which the store itself reports as a missing key)."""
    with storage_errors(location):
        if location.exists():
            return True
        code = _listing_code(location) if location.bucketed else None
    if code in _MISSING_BUCKET:
        raise _client_error(location, code, 404, False)
    return False


def missing(location: Location, name: str | None = None) -> FileNotFoundError:
    """The error for an input that is not there, ``name`` (a flag) naming it. A glob pattern is told as
    one: an input is a file or a directory, which a resume can list again as it was."""
    name = name or location.uri
    pattern = re.search(r"[*?[]", location.uri)
    if pattern is None:
        return FileNotFoundError(f"{name} does not exist")
    folder = location.uri[:pattern.start()].rpartition("/")[0] or "."
    return FileNotFoundError(f"{name} is a pattern, which datamask does not expand: name a parquet file or "
                             f"the directory of them, e.g. {folder}")


def _listing_code(location: Location) -> str | None:
    """The S3 error code of listing ``location``'s prefix (one key at most), None when it lists or
    this is not S3. The probe's own failure to connect or to find credentials raises."""
    call = getattr(location.fs, "call_s3", None)
    if call is None:
        return None
    bucket, key, _ = location.fs.split_path(location.path)
    try:
        call("list_objects_v2", Bucket=bucket, Prefix=key, MaxKeys=1)
    except Exception as exc:
        for error in _chain(exc):
            response = getattr(error, "response", None)
            if isinstance(response, dict):
                return str(response.get("Error", {}).get("Code") or "")
        raise
    return None


def _chain(exc: BaseException):
    """``exc`` and its causes (``raise ... from``: how s3fs wraps botocore's errors)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__


def _endpoint(url: str | None) -> str | None:
    """``scheme://host:port`` of a request URL."""
    if not url:
        return None
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.netloc else url


def _endpoint_of(location: Location) -> str | None:
    """The S3 endpoint ``location``'s filesystem talks to, where one is set."""
    fs = location.fs
    options = getattr(fs, "client_kwargs", None) or {}
    return getattr(fs, "endpoint_url", None) or options.get("endpoint_url") or environment_endpoint()


def environment_endpoint() -> str | None:
    """The S3 endpoint the environment names, as boto3 reads it (``AWS_ENDPOINT_URL_S3``, else
    ``AWS_ENDPOINT_URL``): the lakehouse libraries are given it where their own settings name none."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def _bucket(uri: str) -> str:
    return uri.split("://", 1)[-1].split("/", 1)[0]


def fsync(path: str) -> None:
    """Make a file's bytes, or a directory's entries (a rename or a new file in it), durable."""
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
