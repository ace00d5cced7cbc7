"""Object storage that cannot be reached or refuses a request fails in one line naming the URI, what
failed and what to set: no credentials, wrong ones, no endpoint, no bucket, a read-only bucket.

Every case runs against the real S3 server of the ``s3`` fixture (moto, its own process): wrong
credentials with its IAM checks switched on (``/moto-api/reset-auth``), a read-only bucket by a
bucket policy denying ``s3:PutObject``.
"""

from __future__ import annotations

import json
import os
import urllib.request

import dask.dataframe as dd
import pytest
from conftest import FAST

from datamask_dask.cli import main
from datamask_dask.errors import DataMaskError, StorageError
from datamask_dask.io.parquet import read_parquet
from datamask_dask.io.sinks import write_parquet
from datamask_dask.io.storage import resolve
from datamask_dask.run.selection import write_selection
from datamask_dask.sample_data import make_corpus

pytest.importorskip("s3fs", reason="s3fs is not installed (pip install 'datamask-dask[s3]')")
pytest.importorskip("moto", reason="moto[server] is not installed (the test extra brings it)")

pytestmark = pytest.mark.slow  # a server

FLAGS = ["--n_epochs", str(FAST["n_epochs"]), "--n_rollout", str(FAST["n_rollout"]), "--select_ratio", "0.1"]
NO_ENDPOINT = "http://127.0.0.1:9"  # the discard port: nothing listens there
READ_ONLY = "lake-read-only"
MISSING = "no-such-bucket"


@pytest.fixture(scope="module")
def local_corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("errors-corpus") / "corpus"
    write_parquet(dd.from_pandas(make_corpus(300, 8, seed=1), npartitions=2, sort=False), path)
    return path


@pytest.fixture(scope="module")
def store(s3, local_corpus):
    """s3://lake/errors-corpus, a bucket whose policy denies writes, and an IAM user's key (for a
    wrong secret once moto checks credentials)."""
    import boto3

    resolve("s3://lake", s3).fs.put(str(local_corpus) + "/", "lake/errors-corpus/", recursive=True)
    settings = {"endpoint_url": s3["endpoint_url"], "region_name": "us-east-1",
                "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    client = boto3.client("s3", **settings)
    client.create_bucket(Bucket=READ_ONLY)
    deny = {"Effect": "Deny", "Principal": "*", "Action": "s3:PutObject",
            "Resource": f"arn:aws:s3:::{READ_ONLY}/*"}
    client.put_bucket_policy(Bucket=READ_ONLY,
                             Policy=json.dumps({"Version": "2012-10-17", "Statement": [deny]}))
    iam = boto3.client("iam", **settings)
    iam.create_user(UserName="datamask-reader")
    key = iam.create_access_key(UserName="datamask-reader")["AccessKey"]
    return {"uri": "s3://lake/errors-corpus", "key": key["AccessKeyId"], "client": client}


def _moto_auth(endpoint: str, count: str) -> None:
    """Moto checks every request's credentials after ``count`` more requests ("inf": never)."""
    request = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=count.encode(), method="POST",
                                     headers={"Content-Type": "text/plain"})
    urllib.request.urlopen(request, timeout=10).read()


@pytest.fixture
def environment(s3, monkeypatch):
    """``set(case)``: the AWS environment of a case (a fresh s3fs client each time: a cached one keeps
    the credentials it was made with); the server's IAM checks are on for "wrong" only."""
    import s3fs

    checking = []

    def set_case(case: str) -> None:
        for name in list(os.environ):
            if name.startswith("AWS_") and name not in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ALLOW_HTTP"):
                monkeypatch.delenv(name)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)  # no credentials from this machine
        monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # a refused connection is retried for ~9 s otherwise
        monkeypatch.setenv("AWS_ENDPOINT_URL", NO_ENDPOINT if case == "endpoint" else s3["endpoint_url"])
        if case != "missing":
            monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")  # not an IAM key: refused once moto checks
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        if (case == "wrong") != bool(checking):
            _moto_auth(s3["endpoint_url"], "0" if case == "wrong" else "inf")
            checking[:] = [True] if case == "wrong" else []
        s3fs.S3FileSystem.clear_instance_cache()

    yield set_case
    if checking:
        _moto_auth(s3["endpoint_url"], "inf")
    s3fs.S3FileSystem.clear_instance_cache()


# case -> what the one line says (besides the URI)
SAYS = {
    "missing": ["no usable credentials", "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)",
                "storage_options={'key': ..., 'secret': ...}"],
    "wrong": ["refused the credentials (InvalidAccessKeyId)", "AWS_ACCESS_KEY_ID", "storage_options"],
    "endpoint": [f"cannot connect to the storage endpoint {NO_ENDPOINT}", "set AWS_ENDPOINT_URL",
                 "storage_options={'endpoint_url': ...}"],
    "bucket": [f"the bucket {MISSING} does not exist", "AWS_ENDPOINT_URL"],
    "read-only": ["permission denied to write", "AWS_ACCESS_KEY_ID or AWS_PROFILE"],
}


def _one_line(capsys, uri: str, case: str) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"datamask: error: {uri}: "), err
    for words in SAYS[case]:
        assert words in lines[0], err
    return lines[0]


def _input_uri(store, case: str) -> str:
    return f"s3://{MISSING}/corpus" if case == "bucket" else store["uri"]


@pytest.mark.parametrize("case", ["missing", "wrong", "endpoint", "bucket"])
def test_select_with_an_unreachable_input_fails_in_one_line(store, environment, case, tmp_path, capsys):
    uri = _input_uri(store, case)
    environment(case)
    assert main(["select", "--input", uri, "--output", str(tmp_path / "out"), *FLAGS]) == 1
    _one_line(capsys, uri, case)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("case", ["missing", "wrong", "endpoint", "bucket"])
def test_validate_with_an_unreachable_input_fails_in_one_line(store, environment, case, capsys):
    uri = _input_uri(store, case)
    environment(case)
    assert main(["validate", "--input", uri]) == 1
    _one_line(capsys, uri, case)


@pytest.mark.parametrize("case", ["missing", "wrong", "endpoint", "bucket"])
def test_a_delta_table_on_an_unreachable_store_fails_in_the_same_line(store, environment, case, tmp_path,
                                                                      local_corpus, capsys):
    """As input and as output: told by the object store's probe, as for parquet, not by deltalake's
    credential chain's log."""
    pytest.importorskip("deltalake", reason="the lakehouse extra (deltalake) is not installed")
    uri = _input_uri(store, case)
    environment(case)
    assert main(["select", "--input", f"delta+{uri}", "--output", str(tmp_path / "out"), *FLAGS]) == 1
    _one_line(capsys, uri, case)
    out = f"s3://{MISSING if case == 'bucket' else 'lake'}/errors-delta-{case}"
    assert main(["select", "--input", str(local_corpus), "--output", f"delta+{out}", *FLAGS]) == 1
    _one_line(capsys, out, case)


@pytest.mark.parametrize("case", ["wrong", "endpoint"])  # (moto serves a request without credentials)
def test_an_iceberg_table_on_an_unreachable_store_fails_in_the_same_line(store, environment, case, tmp_path,
                                                                        local_corpus):
    """Its metadata unread by pyiceberg's file IO: told by the object store's probe of the catalog's
    warehouse, as for parquet, with the catalog's own properties beside the variables."""
    pytest.importorskip("pyiceberg.catalog.sql", reason="pyiceberg is not installed (the lakehouse extra)")
    pytest.importorskip("sqlalchemy", reason="pyiceberg's SQL catalog needs sqlalchemy")
    from datamask_dask.io.iceberg import iceberg_record
    from datamask_dask.run.tables import select_table

    warehouse = f"s3://lake/errors-iceberg-{case}"
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/cat.db", "warehouse": warehouse}
    environment("ok")
    select_table(str(local_corpus), "iceberg://errors/ns.corpus", catalog_properties=catalog, **FAST)
    environment(case)
    with pytest.raises(StorageError) as raised:
        select_table("iceberg://errors/ns.corpus", str(tmp_path / "out"), catalog_properties=catalog, **FAST)
    said = str(raised.value)
    assert said.startswith(f"{warehouse}: ") and "\n" not in said, said
    assert all(words in said for words in SAYS[case]) and "the catalog errors's s3.* properties" in said, said
    with pytest.raises(StorageError, match=f"^{warehouse}: "):  # its record, as report and explain read it
        iceberg_record("errors", "ns.corpus", **catalog)


@pytest.mark.parametrize("command", ["report", "explain", "embed", "score"])
def test_the_other_commands_on_an_unreachable_store_fail_in_one_line(store, environment, command, tmp_path,
                                                                     capsys):
    """What `select` tells of a store it cannot reach, the commands that read an output or a corpus
    tell in the same line, not in botocore's traceback."""
    uri = store["uri"]
    environment("endpoint")
    args = {"report": [uri], "explain": [uri, "--id", "1"]}.get(
        command, ["--input", uri, "--output", str(tmp_path / "out")])
    assert main([command, *args]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"datamask {command}: error: {uri}: "), err
    assert all(words in err for words in SAYS["endpoint"]), err


def test_a_report_into_a_missing_bucket_fails_in_one_line_and_creates_none(store, environment, capsys):
    environment("ok")
    output = "s3://lake/errors-report-of"
    assert main(["select", "--input", store["uri"], "--output", output, *FLAGS]) == 0
    capsys.readouterr()
    assert main(["report", output, "--out", f"s3://{MISSING}/report"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"datamask report: error: s3://{MISSING}/report: the bucket {MISSING} does not "
                          "exist"), err
    assert MISSING not in [b["Name"] for b in store["client"].list_buckets()["Buckets"]]


@pytest.mark.parametrize("case", ["missing", "wrong", "endpoint", "bucket", "read-only"])
def test_select_with_an_unreachable_output_fails_in_one_line(store, environment, case, local_corpus, capsys):
    bucket = {"bucket": MISSING, "read-only": READ_ONLY}.get(case, "lake")
    uri = f"s3://{bucket}/errors-out-{case}"
    environment(case)
    assert main(["select", "--input", str(local_corpus), "--output", uri, *FLAGS]) == 1
    _one_line(capsys, uri, case)
    environment("ok")
    names = [b["Name"] for b in store["client"].list_buckets()["Buckets"]]
    assert MISSING not in names  # a missing bucket is never created
    listed = store["client"].list_objects_v2(Bucket=bucket, Prefix="") if bucket in names else {}
    assert not [o["Key"] for o in listed.get("Contents", []) if "errors-out" in o["Key"]]  # nothing written


def _options(s3, store, case: str) -> dict:
    options = {"endpoint_url": s3["endpoint_url"], "client_kwargs": {"region_name": "us-east-1"},
               "config_kwargs": {"retries": {"max_attempts": 1}}}
    if case == "endpoint":
        options["endpoint_url"] = NO_ENDPOINT
    if case == "wrong":  # a key moto knows, with a wrong secret
        options.update(key=store["key"], secret="not-the-secret")
    elif case != "missing":
        options.update(key="testing", secret="testing")
    return options


@pytest.mark.parametrize("case, says", [("missing", "no usable credentials"),
                                        ("wrong", "refused the credentials (SignatureDoesNotMatch)"),
                                        ("endpoint", f"cannot connect to the storage endpoint {NO_ENDPOINT}"),
                                        ("bucket", f"the bucket {MISSING} does not exist")])
def test_read_parquet_raises_a_storage_error_naming_the_uri(s3, store, environment, case, says):
    uri = _input_uri(store, case)
    environment("wrong" if case == "wrong" else "missing")  # nothing from the environment but the check
    with pytest.raises(StorageError) as raised:
        read_parquet(uri, storage_options=_options(s3, store, case))
    assert isinstance(raised.value, DataMaskError)
    assert str(raised.value).startswith(f"{uri}: ") and says in str(raised.value)
    assert "storage_options" in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("case, says", [("missing", "no usable credentials"),
                                        ("endpoint", f"cannot connect to the storage endpoint {NO_ENDPOINT}"),
                                        ("bucket", f"the bucket {MISSING} does not exist"),
                                        ("read-only", "permission denied to write")])
def test_write_selection_raises_a_storage_error_before_any_work(s3, store, environment, local_corpus, case,
                                                                  says, monkeypatch):
    from datamask_dask.dask_engine.runs import DaskEngine

    def planned(*args, **kwargs):
        raise AssertionError("the job was planned before its output was checked")

    monkeypatch.setattr(DaskEngine, "plan", planned)
    bucket = {"bucket": MISSING, "read-only": READ_ONLY}.get(case, "lake")
    uri = f"s3://{bucket}/api-errors-out"
    ddf = read_parquet(local_corpus)
    environment("missing")  # nothing from the environment: the storage_options alone
    with pytest.raises(StorageError) as raised:
        write_selection(ddf, uri, storage_options=_options(s3, store, case), scheduler="sync", ratio=0.1,
                        **FAST)
    assert str(raised.value).startswith(f"{uri}: ") and says in str(raised.value)
    assert "storage_options" in str(raised.value) and "\n" not in str(raised.value)


def test_a_late_storage_failure_is_one_line_too(store, environment, tmp_path, monkeypatch, capsys):
    """A failure after the checks (a connection lost mid-job) gets the same line, naming the job's URIs."""
    import pickle

    from botocore.exceptions import EndpointConnectionError

    from datamask_dask.run import tables

    def lost(source):
        raise EndpointConnectionError(endpoint_url=f"{NO_ENDPOINT}/lake/errors-corpus/part.0.parquet")

    monkeypatch.setattr(tables, "input_fingerprint", lost)  # the input's files listed once the checks passed
    environment("ok")
    assert main(["select", "--input", store["uri"], "--output", str(tmp_path / "out"), *FLAGS]) == 1
    line = _one_line(capsys, store["uri"], "endpoint")
    assert str(tmp_path) not in line  # a local output is not the storage that failed
    error = StorageError("s3://b/k: cannot connect", "endpoint")
    copy = pickle.loads(pickle.dumps(error))  # as it comes back from a Dask worker
    assert str(copy) == str(error) and copy.reason == "endpoint"
