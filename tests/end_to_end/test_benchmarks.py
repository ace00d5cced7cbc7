"""The benchmark machinery: every script imports against the package, the regression gate's verdicts,
the results records, and the suite's graph counts on the real plan graph."""

import importlib
import json
import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import record  # noqa: E402
import regression_gate  # noqa: E402

LIMITS = Namespace(points=0.5, factor=1.3)


# what the scripts share: they import these, never one another (task_peaks: a workers' preload)
SHARED = ("record", "tables", "jobs", "task_peaks")


@pytest.mark.parametrize("script", sorted(p.stem for p in BENCHMARKS.glob("*.py")))
def test_a_benchmark_script_imports(script):
    """They run by hand, not in CI: an import the package no longer offers must fail here."""
    module = importlib.import_module(script)
    assert callable(getattr(module, "main", None)) or script in SHARED, script
    scripts = {p.stem for p in BENCHMARKS.glob("*.py")} - set(SHARED)
    imported = {getattr(value, "__module__", None) or getattr(value, "__name__", None)
                for value in vars(module).values()} & (scripts - {script})  # modules, and names from them
    assert not imported, f"{script} imports the scripts {imported}: move what they share to {SHARED}"


def result(value, unit, low=None, high=None):
    return (value, low, high, unit, "track")


@pytest.mark.parametrize(("before", "after", "state"), [
    (result(99.5, "points"), result(99.1, "points"), "OK"),  # a drop within half a point
    (result(99.5, "points"), result(98.9, "points"), "FAIL"),
    (result(9.8, "points (lower is better)"), result(10.5, "points (lower is better)"), "FAIL"),
    (result(9.8, "points (lower is better)"), result(8.0, "points (lower is better)"), "OK"),
    (result(1600, "rows"), result(1601, "rows"), "FAIL"),  # exact counts do not move
    (result(2.0, "seconds"), result(2.5, "seconds"), "OK"),
    (result(2.0, "seconds"), result(2.7, "seconds"), "FAIL"),
    (result(2.0, "seconds", 1.5, 3.0), result(2.7, "seconds", 2.2, 3.2), "OK"),  # within the noise
    (result(2.0, "seconds", 1.9, 2.1), result(2.7, "seconds", 2.6, 2.8), "FAIL"),
    (result(300e6, "bytes"), result(420e6, "bytes"), "FAIL"),
    (result(2.0, "seconds"), result(None, "seconds"), "FAIL"),  # it ran on the base, fails now
    (result(None, "seconds"), result(2.0, "seconds"), "new"),
])
def test_the_gate_fails_on_a_quality_drop_a_changed_count_or_growth_beyond_the_factor(before, after, state):
    assert regression_gate.verdict(before, after, LIMITS)[0] == state


def test_a_scripts_markdown_becomes_tables_with_their_captions():
    title, tables = record.tables_of(
        "# Search at 1,000 rows\n\nCommand: `python x.py`\n\n| rows | s |\n|---:|---:|\n| 1,000 | 0.5 |\n\n"
        "Recall by cosine:\n\n| rows | 0.98 |\n|---|---|\n| 1,000 | 99% |\n")
    assert title == "Search at 1,000 rows"
    assert tables == [{"columns": ["rows", "s"], "rows": [["1,000", "0.5"]]},
                      {"caption": "Recall by cosine:", "columns": ["rows", "0.98"],
                       "rows": [["1,000", "99%"]]}]


def test_a_record_states_command_data_machine_and_commit(tmp_path):
    path = tmp_path / "results.json"
    record.append(path, command="python benchmarks/x.py", data={"table": {"rows": 10}},
                  markdown="| a |\n|---|\n| 1 |")
    entry = record.append(path, command="python benchmarks/x.py --again", data="d",
                          markdown="| a |\n|---|\n| 2 |")
    assert entry["machine"] and entry["commit"] and entry["tables"][0]["rows"] == [["2"]]
    assert len(json.loads(path.read_text())) == 2


def test_the_suites_graph_counts_grow_from_one_task_to_task_to_task():
    from suite.graph import PlanGraph

    counts = {}
    for wiring in ("one task, 20 partitions", "task to task, 60 partitions"):
        bench = PlanGraph()
        bench.setup(wiring)
        counts[wiring] = bench.track_tasks(wiring)
        assert bench.track_layer_entries(wiring) >= counts[wiring]
    assert 0 < counts["one task, 20 partitions"] < counts["task to task, 60 partitions"]


def test_a_timing_measured_again_counts_its_least_value_and_a_failure_only_if_it_fails_again():
    first = {("t", ()): result(2.0, "seconds"), ("f", ()): result(None, "rows")}
    again = {("t", ()): result(1.5, "seconds"), ("f", ()): result(1600, "rows")}
    merged = regression_gate.least(first, again)
    assert merged[("t", ())][0] == 1.5 and merged[("f", ())][0] == 1600
    assert regression_gate.least(again, first)[("t", ())][0] == 1.5


def test_a_record_made_on_a_copy_of_the_tree_takes_the_commit_it_was_sent_at(tmp_path, monkeypatch):
    """The GPU acceptance run works on a copy of the tree sent to another machine, with or without a
    (possibly stale) .git: BENCH_COMMIT names the commit sent (scripts/gpu-acceptance.sh)."""
    monkeypatch.delenv("BENCH_COMMIT", raising=False)
    assert record.commit() not in ("unknown", "")  # a checkout names its own
    assert record.commit(tmp_path) == "unknown"
    monkeypatch.setenv("BENCH_COMMIT", "abc1234")
    assert record.commit(tmp_path) == record.commit() == "abc1234"


def test_the_quality_layouts_hold_the_same_rows_and_count_the_pieces_their_jobs_learn_apart(tmp_path,
                                                                                          monkeypatch):
    import bench_quality
    import pyarrow.parquet as pq
    import tables
    from suite.data import topic_labels

    monkeypatch.setattr(tables, "CACHE", tmp_path)
    for layout in ("spread", "topics"):
        monkeypatch.setitem(tables.CASES, layout, tables.Case(1200, 8, 4, 6, layout, 300))
    files = {}
    for layout in ("spread", "topics"):
        source, _, emb = tables.dataset(layout)
        files[layout] = [pq.read_table(source / f"part.{n}.parquet")["chunk_id"].to_numpy() for n in range(4)]
        assert bench_quality.pieces(source, bench_quality.job_config(layout, [], "cpu"), "Pair_simi") == 4
        assert bench_quality.pieces(source, bench_quality.job_config(layout, ["max_chunk_rows=1200"], "cpu"),
                                    "Pair_simi") == 1  # the ceiling: the table as one piece
    assert sorted(np.concatenate(files["spread"])) == sorted(np.concatenate(files["topics"]))
    labels = topic_labels(emb, 6)
    topics = {layout: max(len(set(labels[ids])) for ids in parts) for layout, parts in files.items()}
    assert topics["topics"] < topics["spread"] == 6


@pytest.mark.slow
def test_a_timing_against_another_checkout_runs_its_package_beside_the_first_setting(tmp_path, monkeypatch,
                                                                                      capsys):
    """``--timing --against CHECKOUT``: the first setting's job again, run by that tree's package and
    named by its commit (here the tree itself); a tree without the package is refused, naming the flag."""
    import bench_quality
    import tables

    monkeypatch.setattr(tables, "CACHE", tmp_path)
    monkeypatch.setitem(tables.CASES, "tiny", tables.Case(1200, 8, 4, 6, "spread", 300))
    with pytest.raises(SystemExit):
        bench_quality.main(["--case", "tiny", "--timing", "1", "--against", str(tmp_path)])
    assert f"--against {tmp_path}: needs --timing and a source tree holding" in capsys.readouterr().err
    tree = BENCHMARKS.parent
    assert bench_quality.main(["--case", "tiny", "--metrics", "Pair_simi", "--lambs", "0", "--timing", "1",
                               "--against", str(tree)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| tiny |")]
    commit = record.commit(tree)
    assert [row.split(" | ")[3] for row in rows] == ["defaults", f"defaults at {commit}"]


def test_every_way_of_bench_rounds_selects_exactly_k_rows_and_one_piece_is_scored(tmp_path, monkeypatch):
    import math

    import bench_rounds
    import tables

    monkeypatch.setattr(tables, "CACHE", tmp_path)
    monkeypatch.setitem(tables.CASES, "tiny", tables.Case(1200, 8, 4, 6, "topics", 300))
    table = bench_rounds.prepare("tiny")
    ways = bench_rounds.ways([2, 3])
    disf = {name: ways[name] for name in ("pieces", "table moments", "context", "context, shares",
                                          "one piece")}
    for metric, chosen in (("Pair_simi", ways), ("DiSF", disf)):
        results = bench_rounds.compare(table, metric, 0.0, chosen)
        assert table.k == 120 and len(results) == len(chosen)
        for name, (selection, _) in results.items():
            assert np.unique(selection.rows).size == table.k, (metric, name)
            # near-duplicates set aside stay out
            assert np.isin(selection.rows, table.eligible).all(), (metric, name)
        assert math.isfinite(results["one piece"][1].share)


@pytest.mark.slow
def test_selections_brought_back_from_a_gpu_run_are_scored_with_the_yardstick(tmp_path, monkeypatch, capsys):
    """gpu_acceptance.py's round trip, on CPU: the rows a job selected are packed into a file, and the
    score step reads them back and measures them against the same table."""
    import gpu_acceptance
    import tables

    monkeypatch.setattr(tables, "CACHE", tmp_path / "cache")
    monkeypatch.setitem(tables.CASES, "tiny", tables.Case(3000, 16, 2, 30))
    selections, scores = tmp_path / "selections.npz", tmp_path / "scores.json"
    assert gpu_acceptance.main(["selections", "--case", "tiny", "--metrics", "Pair_simi", "--lambs", "0",
                                "--device", "cpu", "--out", str(selections)]) == 0
    assert gpu_acceptance.main(["score", str(selections), "--json", str(scores)]) == 0
    (scored,) = json.loads(scores.read_text())
    assert (scored["metric"], scored["rows"], scored["case"]) == ("Pair_simi", 3000, "tiny")
    assert scored["objective"] > scored["random"] and scored["share"] > 0.5


def test_the_wall_account_counts_every_second_once_shares_overlaps_and_names_the_drivers_gaps():
    import jobs

    # offsets in quarters of a second: exact at an epoch time's precision
    started, token = 1_700_000_000.0, "5b0e2c9a6f1d4e3b8a7c6d5e4f3a2b1c"

    def task(key, thread, *spans, worker=1):
        return {"key": key, "worker": f"tcp://127.0.0.1:{worker}", "thread": thread,
                "startstops": [{"action": action, "start": started + start, "stop": started + stop}
                               for action, start, stop in spans]}

    tasks = [
        # a worker whose estimate of its clock's offset put its task before the job: moved in, to 0-0.5
        task(f"datamask-plan-{token}", 1, ("compute", -0.75, -0.25), worker=2),
        task((f"datamask-select-write-{token}", 0), 1, ("compute", 2.0, 6.0)),
        task((f"read_parquet-{token}", 1), 2, ("compute", 3.0, 5.0)),
        task((f"datamask-select-write-{token}", 1), 2, ("transfer", 5.0, 5.5), ("compute", 5.5, 8.5)),
    ]
    phases = {"plan": 1.0, "select and write": 7.5, "summary": 0.5, "commit": 0.5}
    account = jobs.wall_account(tasks, started, started + 10.0, phases)
    assert account == pytest.approx({
        "datamask-plan": 0.5,
        "driver: plan": 0.5,  # the gaps around the plan task, inside the plan's window
        "datamask-select-write": 1.0 + 2 * 0.5 + 0.25 + 0.5 + 2.5,  # two threads of it count once
        "read_parquet": 1.0,  # half of the 2 s it overlaps a select task
        "transfer": 0.25,
        "driver: between passes / scheduling": 1.0 + 0.5,
        "driver: summary": 0.5,
        "driver: commit": 0.5,
    }, abs=1e-9)
    assert abs(sum(account.values()) - 10.0) < 1e-9
    lines = jobs.wall_account_lines([({"rows": "1,000", "workers": "1 x 2"}, account, 10.0)])
    _, (table,) = record.tables_of("\n".join(lines))
    assert table["caption"].endswith(":") and table["columns"][-3:] == ["activity", "s", "share of wall"]
    assert table["rows"][0][2] == "datamask-select-write"  # biggest first
    assert table["rows"][-1][2:] == ["total (wall)", "10.00", "100%"]


@pytest.mark.slow  # a cluster
def test_a_pipeline_jobs_wall_account_adds_up_to_its_wall_time(tmp_path):
    import jobs
    import tables

    source = tables.ensure_dataset(tmp_path / "cache", 4000, 16, 2000, 20)
    result = jobs.cluster_job(source, tmp_path / "out", 1, str(BENCHMARKS.parent / "conf" / "cpu.yaml"),
                              {"algorithm": "Pair_simi"})
    assert abs(sum(result["account"].values()) - result["wall"]) < 1e-6
    assert result["account"].get("datamask-select-write", 0) > 0, result["account"]
    assert result["rows"] == 4000


def _hold(megabytes: int) -> int:
    block = np.ones(megabytes << 17)  # float64: 8 bytes each, touched
    return int(block[::4096].sum())


@pytest.mark.slow  # a cluster
def test_a_tasks_own_peak_counts_what_it_allocates_and_not_what_the_worker_held_before(tmp_path, monkeypatch):
    from distributed import Client, LocalCluster
    from task_peaks import collected

    monkeypatch.setenv("DATAMASK_TASK_PEAKS", str(tmp_path))
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                      preload=[str(BENCHMARKS / "task_peaks.py")]) as cluster, Client(cluster) as client:
        held = client.submit(np.ones, 200 << 17, key="held-block")  # 200 MiB the worker keeps
        client.submit(_hold, 300, key="large-task").result()  # its 300 MiB freed as it ends
        client.submit(len, held, key="small-task").result()
    peaks = collected(tmp_path)
    assert peaks["large-task"] > 290 * 2**20, peaks
    assert peaks["small-task"] < 50 * 2**20, peaks  # neither the held block nor the earlier task's peak
