"""The CLI behaves like a finished tool: one clear line per error naming the flag to change,
profiles by name, a version, help without markup, resumable failures only when something finished."""

from __future__ import annotations

import contextlib
import gc
import os
import re
import signal
import subprocess
import sys
import time

import dask.dataframe as dd
import numpy as np
import pytest
import torch
from conftest import FAST

from datamask_dask import write_parquet
from datamask_dask.arguments import as_cli_message
from datamask_dask.cli import _interrupts_that_land, build_parser, main
from datamask_dask.run.selection import work_dir
from datamask_dask.sample_data import make_corpus

FLAGS = ["--n_epochs", str(FAST["n_epochs"]), "--n_rollout", str(FAST["n_rollout"])]


@pytest.fixture
def source(tmp_path, corpus):
    path = tmp_path / "in"
    write_parquet(dd.from_pandas(corpus, npartitions=2, sort=False), path)
    return path


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("datamask-dask ")


def test_help_has_no_markup_and_names_the_defaults():
    select = build_parser()._subparsers._group_actions[0].choices["select"]
    text = select.format_help()
    assert "``" not in text and ":mod:" not in text and ":func:" not in text
    for flag, default in (("--algorithm", "Pair_simi"), ("--lamb", "0.5"), ("--device", "auto")):
        start = text.index(f"\n  {flag}")  # its entry in the option list, not the usage line
        line = text[start:start + 300]
        assert "default" in line and default in line, line


def test_every_option_is_a_flag_that_reaches_the_run(source, tmp_path):
    """The flags are made from the options' fields: each option has one, with its help text and the parse
    its type asks for, and what a flag says is what the run records."""
    from datamask_dask.io.output import read_record
    from datamask_dask.options import FIELDS

    select = build_parser()._subparsers._group_actions[0].choices["select"]
    actions = {action.dest: action for action in select._actions}
    for name, field in FIELDS.items():
        assert actions[name].help.startswith(field.metadata["help"]), name
    args = select.parse_args(["--probes", "3", "--refine_lr", "0.7", "--quality-column", "a=1,b=3",
                              "--no-check-ids", "--explain", "--select_ratio", "0.2", "--final", "topk"])
    assert (args.probes, args.refine_lr, args.quality_column, args.check_ids, args.explain, args.ratio,
            args.final) == (3, 0.7, {"a": 1.0, "b": 3.0}, False, True, 0.2, "topk")
    out = tmp_path / "out"
    assert main(["select", "--input", str(source), "--output", str(out), *FLAGS, "--probes", "3",
                 "--final", "topk", "--no-check-ids"]) == 0
    settings = read_record(out)["settings"]
    assert (settings["probes"], settings["final"], settings["check_ids"]) == (3, "topk", False)


def test_profiles_by_name_and_the_summary_names_it(source, tmp_path, capsys):
    assert main(["select", "--input", str(source), "--output", str(tmp_path / "o1"), *FLAGS]) == 0
    out = capsys.readouterr().out
    assert "profile cpu" in out and "with start-up" in out
    assert main(["select", "--input", str(source), "--output", str(tmp_path / "o2"), "--config", "gpu",
                 "--device", "cpu", *FLAGS]) == 0
    told = capsys.readouterr()
    assert "profile gpu" in told.out
    # its GPU-sized chunks learned on the CPU: said once, with the way out
    assert told.err.count("profile 'gpu' on pandas partitions, which device='cpu' learns on the CPU: "
                          "its chunks of up to 1000000 rows are sized for a GPU; use the cpu profile "
                          "(config='cpu', --config cpu)") == 1
    assert main(["select", "--input", str(source), "--output", str(tmp_path / "o3"), "--config", "cpx"]) == 1
    assert "did you mean 'cpu'" in capsys.readouterr().err


def test_misspelt_algorithm_gets_a_suggestion(source, tmp_path, capsys):
    assert main(["select", "--input", str(source), "--output", str(tmp_path / "o"), "--algorithm",
                 "Faciltiy"]) == 1
    err = capsys.readouterr().err
    assert "did you mean 'Facility'" in err and "'fl'" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA device")
def test_a_failure_before_any_partition_finished_leaves_nothing_to_resume(source, tmp_path, capsys):
    target = tmp_path / "out"
    assert main(["select", "--input", str(source), "--output", str(target), "--device", "cuda", *FLAGS]) == 1
    err = capsys.readouterr().err
    assert "--device" in err and "resume" not in err and not work_dir(target).exists()
    # the corrected command is not refused as "started with other options"
    assert main(["select", "--input", str(source), "--output", str(target), "--device", "cpu", *FLAGS]) == 0


@pytest.mark.parametrize(("change", "hint", "spelling", "fix"), [
    ({"chunk_id": lambda f: f["chunk_id"] % 100}, "--no-check-ids", "check_ids=False", ["--no-check-ids"]),
    ({"selected": False}, "--selected-column", "selected_column=", ["--selected-column", "keep"]),
], ids=["duplicate ids", "a taken selected column"])
def test_a_hint_names_the_cli_flag_that_fixes_it(tmp_path, corpus, capsys, change, hint, spelling, fix):
    source = tmp_path / "in"
    write_parquet(dd.from_pandas(corpus.assign(**change), npartitions=2, sort=False), source)
    assert main(["select", "--input", str(source), "--output", str(tmp_path / "o"), *FLAGS]) == 1
    err = capsys.readouterr().err
    assert hint in err and spelling not in err
    assert main(["select", "--input", str(source), "--output", str(tmp_path / "o"), *fix, *FLAGS]) == 0


def test_a_missing_column_is_named_by_its_flag(source, tmp_path, capsys):
    assert main(["select", "--input", str(source), "--output", str(tmp_path / "p"), "--id-column", "doc",
                 *FLAGS]) == 1
    err = capsys.readouterr().err
    assert "--id-column" in err and "id_column=" not in err


def test_two_options_that_contradict_each_other_are_named_by_their_flags(source, tmp_path, capsys):
    assert main(["select", "--input", str(source), "--output", str(tmp_path / "p"), "--min_lr", "20",
                 "--max_lr", "1", *FLAGS]) == 1
    assert "options --min_lr=20.0 and --max_lr=1.0 are invalid: expected 0 <= min_lr <= max_lr" \
        in capsys.readouterr().err


def test_a_writing_keyword_in_a_config_file_is_told_as_the_flags(source, tmp_path, capsys):
    config = tmp_path / "job.yaml"
    config.write_text("overwrite: true\n")  # a flag of the command, not a setting of the selection
    assert main(["select", "--input", str(source), "--output", str(tmp_path / "p"), "--config", str(config),
                 *FLAGS]) == 1
    err = capsys.readouterr().err
    assert "'overwrite' is not an option of the selection (config file" in err
    assert err.rstrip().endswith("an output is replaced with --overwrite, and appended to (Delta, Iceberg) "
                                 "with --mode append"), err


def test_as_cli_message_translates_keywords_only():
    message = "option ratio=2 is out of range; name yours with id_column=, quality_column= or by=; lamb"
    assert as_cli_message(message) == ("--ratio=2 is out of range; name yours with --id-column, "
                                       "--quality-column or --by; lamb")


def test_non_parquet_input_is_one_line(tmp_path, capsys):
    bad = tmp_path / "notes.parquet"
    bad.write_text("this is not parquet")
    assert main(["select", "--input", str(bad), "--output", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--input" in err[0] and "parquet" in err[0]


def test_a_location_the_output_cannot_take_is_named_by_its_flag(source, tmp_path, capsys):
    """The file system's refusal with the flag whose path it hit, not a bare errno line."""
    (tmp_path / "afile").write_text("")  # a file where the output needs a folder
    output = str(tmp_path / "afile" / "out")
    assert main(["select", "--input", str(source), "--output", output, *FLAGS]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"datamask: error: --output {output}: File exists: {tmp_path / 'afile'}"]


def test_a_directory_given_as_the_config_is_named(source, tmp_path, capsys):
    assert main(["select", "--input", str(source), "--output", str(tmp_path / "o"), "--config",
                 str(source)]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"datamask: error: config file {str(source)!r} is a directory: give a YAML file or a profile's name"]


def test_a_scheduler_address_where_none_runs_is_named_by_its_flag(source, tmp_path, capsys):
    """Said at once (nothing listens there), not after Dask's connect timeout of retries."""
    import socket

    with socket.socket() as free:  # a port nothing listens on once it is closed
        free.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{free.getsockname()[1]}"
    assert main(["select", "--input", str(source), "--output", str(tmp_path / "o"), "--scheduler", address,
                 *FLAGS]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"datamask: error: --scheduler {address}: nothing listens there (connection refused); check the "
        "address a scheduler prints as 'Scheduler at: tcp://...'"]
    assert not (tmp_path / "o").exists()
    assert main(["select", "--input", str(source), "--output", str(tmp_path / "o"), "--scheduler",
                 "head-node", *FLAGS]) == 1  # no port: Dask's own parser raised a traceback
    assert capsys.readouterr().err.strip().splitlines() == [
        "datamask: error: --scheduler head-node: an address is host:port, as a scheduler prints it "
        "('Scheduler at: tcp://10.0.0.5:8786')"]


@pytest.mark.parametrize("workers", [0, -2])
def test_a_cluster_of_no_workers_is_refused_before_it_starts(workers):
    """It would start, and a job on it would wait for ever for a worker."""
    from datamask_dask import get_client

    with pytest.raises(ValueError, match=f"n_workers={workers} must be >= 1"):
        get_client(n_workers=workers)


@pytest.mark.slow
def test_errors_on_a_cluster_are_one_line(tmp_path, corpus):
    frame = corpus.copy()
    frame.loc[3, "quality_score"] = np.nan
    source = tmp_path / "bad"
    write_parquet(dd.from_pandas(frame, npartitions=2, sort=False), source)
    run = subprocess.run([sys.executable, "-m", "datamask_dask.cli", "select", "--input", str(source),
                          "--output", str(tmp_path / "o"), "--n-workers", "2", *FLAGS],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert lines[0].startswith("datamask: starting a local cluster of 2"), run.stderr
    lines = [line for line in lines[1:] if not re.match(r"\d\d:\d\d:\d\d datamask: ", line)]  # its log
    assert len(lines) <= 2, run.stderr  # the error, and at most a line on what is kept
    assert lines[0].startswith("datamask: error: partition 0: quality column 'quality_score'")


@pytest.mark.parametrize("default", [True, False])
def test_a_script_without_main_guard_is_told_so(tmp_path, default):
    """And it ends there: Dask's half-started Client, left to the interpreter's exit, would wait a minute
    to close (a Client not made Dask's default is not closed by Dask's own exit hook)."""
    script = tmp_path / "job.py"
    script.write_text(f"from datamask_dask import get_client\nclient = get_client('cpu', n_workers=1, "
                      f"set_as_default={default})\nclient.shutdown()\n")
    started = time.perf_counter()
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert run.returncode != 0
    assert 'if __name__ == "__main__":' in run.stderr
    assert time.perf_counter() - started < 30 and "timed out" not in run.stderr, run.stderr[-2000:]


def test_a_file_input_over_a_datamask_directory_writes_a_directory(source, tmp_path, capsys):
    """--output named as a directory (or one already) takes a directory, whatever the input is: the
    overwrite completes, and nothing is left to resume."""
    target = tmp_path / "out"
    assert main(["select", "--input", str(source), "--output", str(target), *FLAGS]) == 0
    one = source / "part.0.parquet"
    assert main(["select", "--input", str(one), "--output", f"{target}/", "--overwrite", *FLAGS]) == 0
    assert sorted(p.name for p in target.iterdir()) == ["_datamask_run.json", "part.0.parquet"]
    assert not work_dir(target).exists()
    assert main(["select", "--input", str(one), "--output", str(tmp_path / "one.parquet"), *FLAGS]) == 0
    assert (tmp_path / "one.parquet").is_file()


def test_an_empty_directory_is_written_into(source, tmp_path):
    target = tmp_path / "made-ahead"
    target.mkdir()
    assert main(["select", "--input", str(source), "--output", str(target), *FLAGS]) == 0
    assert (target / "_datamask_run.json").is_file()


@pytest.fixture
def terminal_ctrl_c():
    """Python's own Ctrl-C handler for the test, as under a terminal: a suite started in the background or
    by nohup ignores SIGINT, and its processes, the command's included, would inherit that (a handled
    signal is reset to the default in an exec'd child, an ignored one stays ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _interrupted(source, target, when) -> tuple[int, str]:
    """``datamask select --n-workers 2`` in its own process group, sent a terminal's Ctrl-C (SIGINT to
    the whole group, workers included) once ``when(stderr so far)`` holds; its exit code and stderr."""
    import os
    import signal
    import threading
    import time

    command = [sys.executable, "-m", "datamask_dask.cli", "select", "--input", str(source), "--output",
               str(target), "--n-workers", "2", "--n_epochs", "30000", "--n_rollout", "8"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stderr.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 240
    while not when("".join(lines)) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGINT)
    code = process.wait(timeout=120)
    reader.join(timeout=10)
    return code, "".join(lines)


@pytest.mark.slow
@pytest.mark.usefixtures("terminal_ctrl_c")
def test_ctrl_c_is_one_line_and_counts_what_is_kept(tmp_path, corpus):
    source = tmp_path / "in"
    write_parquet(dd.from_pandas(make_corpus(8000, 16, seed=3), npartitions=8, sort=False), source)
    target = tmp_path / "out"
    code, err = _interrupted(source, target, lambda err: list(work_dir(target).glob("part-*.json")))
    kept = len(list(work_dir(target).glob("part-*.json")))
    assert code == 130 and "Traceback" not in err and "datamask: interrupted" in err, err
    assert f"{kept} finished partition(s) are kept" in err, err
    code, err = _interrupted(source, tmp_path / "other", lambda err: "starting a local cluster" in err)
    assert code == 130 and "Traceback" not in err and "datamask: interrupted" in err, err


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed Ctrl-C
@pytest.mark.parametrize("resent", [False, True])
@pytest.mark.usefixtures("terminal_ctrl_c")
def test_a_ctrl_c_that_python_swallowed_is_sent_again(resent):
    """A Ctrl-C that lands in a garbage collector's callback (Dask registers one) is swallowed by
    Python, and without the command's hook the job runs on to its end."""
    armed = [True]

    def callback(phase, info):
        if armed:
            armed.clear()
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)  # the Ctrl-C is raised here, inside the callback

    gc.callbacks.append(callback)
    steps = 0
    try:
        with _interrupts_that_land() if resent else contextlib.nullcontext():
            gc.collect()
            for _ in range(200):  # the job, running on in steps, so where it stopped is read without a clock
                time.sleep(0.01)
                steps += 1
        interrupted = False
    except KeyboardInterrupt:
        interrupted = True
    finally:
        gc.callbacks.remove(callback)
    assert not armed  # the Ctrl-C was raised in the callback
    assert interrupted == resent
    assert (steps < 200) == resent, steps  # the resent Ctrl-C stopped the job before its end
