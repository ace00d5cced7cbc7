"""Command line: datamask select --input IN --output OUT [options], datamask validate --input IN
and datamask demo.

IN is a parquet file or a directory of parquet files (partitioned dataset); OUT is written as a
file when IN is a file, else as a directory, with every input row and column plus `selected`.
The output appears only when complete: partitions are written as they finish to a hidden work
directory next to OUT (with completion markers and a manifest), then published in one rename,
with a run record (_datamask_run.json). Running the same command again after an interruption
resumes: finished partitions are not recomputed (--no-resume starts over). OUT may not be IN,
contain it or lie inside it; --overwrite replaces only an output of an earlier datamask run.

datamask validate runs the input checks alone (schema, types, NaN/inf, embedding dimension and
norm, duplicate ids, option ranges) and exits 0 with a one-line summary, or 1 with every problem.

The learner flags are the reference tool's (--n_epochs --algorithm --partial --max_lr --min_lr
--n_rollout --select_ratio --init --lamb; hyphenated spellings work too). Flags override a
--config (a profile: cpu, gpu, reference; or a YAML file), which overrides dask.config's
`datamask` namespace. Without --config the device's profile applies (cpu, or gpu for --device
cuda); the printed summary names it.

With no input at all (datamask, datamask demo or datamask select --demo) the job runs end to
end on the embedded synthetic corpus and prints a summary.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
import warnings

if getattr(multiprocessing.current_process(), "_inheriting", False):
    # A cluster's worker process, which imports the command as its main module first (multiprocessing's
    # spawn): a terminal's Ctrl-C reaches it too, and the command stops it without its traceback. Set
    # before the package's imports, which take a while.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

from .arguments import as_cli_message, at_least, flag_name  # noqa: E402
from .errors import DataMaskError, OptionError  # noqa: E402
from .options import FIELDS, LEARNER_KEYS, check_given  # noqa: E402

# Failures reported as one line (no traceback unless --verbose): bad input or options, files.
_REPORTED = (DataMaskError, OSError)


def _per_group(number):
    """The parse of a value that may differ per --by group: ``"0.1"`` -> 0.1, ``"en=0.2,de=0.1"`` ->
    {"en": 0.2, "de": 0.1} (``number`` reads each value)."""
    def parse(text: str):
        parts = [p.strip() for p in text.split(",") if p.strip()]
        try:
            return number(parts[0]) if len(parts) == 1 and "=" not in parts[0] else _pairs(parts, number)
        except ValueError:
            raise argparse.ArgumentTypeError(f"a {number.__name__}, or group={number.__name__},... per --by "
                                             f"group; not {text!r}") from None

    return parse


def _weights(text: str):
    """``"a"`` -> "a"; ``"a,b"`` -> ["a", "b"]; ``"a=0.7,b=0.3"`` -> {"a": 0.7, "b": 0.3}."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if any("=" in p for p in parts):
        try:
            return _pairs(parts, float)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected name=weight pairs, got {text!r}") from exc
    return parts[0] if len(parts) == 1 else parts


def _pairs(parts: list[str], number) -> dict:
    """``["a=0.7", "b=0.3"]`` -> {"a": 0.7, "b": 0.3}, each value read by ``number`` (ValueError where one
    is not a number, or a part has no ``=``)."""
    return {name.strip(): number(value) for name, _, value in (p.partition("=") for p in parts)}


def _add_job_options(parser: argparse.ArgumentParser) -> None:
    """The options' flags, made from their fields (:mod:`datamask_dask.options`), and the job's own."""
    learner = parser.add_argument_group("learner (reference tool's flags)")
    job = parser.add_argument_group("job")
    job.add_argument("--config", help="a profile (cpu, gpu, reference) or a YAML file; flags override it "
                     "(default: the device's profile)")
    job.add_argument("--scheduler", metavar="ADDRESS", help="address of a running Dask scheduler")
    job.add_argument("--n-workers", "--n_workers", type=at_least(1),
                     help="start a local cluster of this many worker processes, each held to its memory "
                     "limit (default: Dask's threads in this process, which start at once and run a job on "
                     "one machine faster; see the benchmarks page)")
    job.add_argument("--threads-per-worker", type=at_least(1), default=1,
                     help="threads of each worker process (a GPU worker's threads read and write beside "
                     "its learner)")
    for name, spec in FIELDS.items():
        group = learner if name in LEARNER_KEYS else job
        flag = flag_name(name)
        if isinstance(spec.default, bool):  # a switch that turns the default over
            flags, kind = [f"--no-{flag}" if spec.default else f"--{flag}"], {"const": not spec.default}
            kind["action"] = "store_const"
        else:
            hyphens = f"--{name.replace('_', '-')}"
            flags = list(spec.metadata.get("flags") or dict.fromkeys([f"--{flag}", f"--{name}", hyphens]))
            parse = spec.metadata.get("type") or str(spec.type).split("|")[0].strip()
            parse = {"weights": _weights, "per_group_int": _per_group(int),
                     "per_group_float": _per_group(float), "int": int, "float": float}.get(parse, str)
            kind = {"choices": spec.metadata["choices"]} if spec.metadata["choices"] else {"type": parse}
        group.add_argument(*flags, dest=name, help=spec.metadata["help"], **kind)
    job.add_argument("--verbose", action="store_true", help="show tracebacks and Dask's logs on errors")
    _show_defaults(parser)


def _show_defaults(parser: argparse.ArgumentParser) -> None:
    """Append each setting's built-in default to its help, from the one place defaults live."""
    from .config import METRIC_DEFAULTS, default_settings, default_text

    settings = default_settings()
    for action in parser._actions:
        flag = action.const is not None  # a switch such as --no-check-ids: its name says what it sets
        stated = settings.get(action.dest) is not None or any(action.dest in metric
                                                               for metric in METRIC_DEFAULTS.values())
        if stated and not flag and "default" not in (action.help or ""):
            text = f"(default: {default_text(action.dest)})"
            action.help = f"{action.help} {text}" if action.help else text


def build_parser() -> argparse.ArgumentParser:
    """The ``datamask`` argument parser."""
    from . import __version__

    parser = argparse.ArgumentParser(prog="datamask",
                                     description="DATAMASK data selection on Dask dataframes.")
    parser.add_argument("--version", action="version", version=f"datamask-dask {__version__}")
    commands = parser.add_subparsers(dest="command")
    select = commands.add_parser("select", help="select rows of a parquet, Delta or Iceberg table",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    select.add_argument("--input", help="parquet file or directory (a local path or a URI: s3://bucket/key, "
                        "gs://, abfs://..., credentials and endpoint from the usual environment variables "
                        "such as AWS_ENDPOINT_URL), delta:///path/to/table or delta+s3://bucket/table "
                        "[?version=N], or iceberg://CATALOG/namespace.table[?snapshot_id=N] (catalog from "
                        ".pyiceberg.yaml)")
    select.add_argument("--output", help="output file (if --input is a file, unless --output ends with / or "
                        "is a directory) or directory, local or a URI (s3://...), or a delta:// / "
                        "delta+s3:// or iceberg:// table URI")
    select.add_argument("--overwrite", action="store_true",
                        help="replace --output if an earlier datamask run wrote it (nothing else is "
                        "replaced)")
    select.add_argument("--output-columns", "--output_columns", choices=("all", "selection"), default="all",
                        help="every column plus `selected` (all), or the selection table only: id, "
                        "selected, the score column if asked, run_id (selection)")
    select.add_argument("--mode", choices=("error", "append", "overwrite"),
                        help="how a Delta or Iceberg --output is written (default: error if it exists; "
                        "--overwrite means overwrite)")
    select.add_argument("--incremental", action="store_true",
                        help="select only among the rows added to a Delta/Iceberg --input since the "
                        "version recorded by --output's last run, and append them to --output")
    select.add_argument("--row-filter", "--row_filter",
                        help="Iceberg --input: rows to consider, e.g. \"lang = 'en'\" (pushed down)")
    select.add_argument("--engine", choices=("dask", "spark"), default="dask",
                        help="run the job on Dask (default) or Spark (pip install 'datamask-dask[spark]')")
    select.add_argument("--spark-master", metavar="URL",
                        help="Spark master for --engine spark (e.g. local[2]); default: spark-submit's")
    select.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bar of partitions done on stderr (default: only on a terminal)")
    select.add_argument("--no-resume", dest="resume", action="store_false",
                        help="discard the finished partitions of an interrupted run instead of reusing them")
    select.add_argument("--demo", action="store_true", help="run on the embedded sample corpus instead")
    _add_corpus_options(select)
    _add_job_options(select)
    validate = commands.add_parser("validate", help="check an input and the options, select nothing",
                                   description="Run the input checks of `datamask select` alone: exit 0 "
                                   "with a summary, or 1 with every problem found.")
    validate.add_argument("--input", required=True, help="any input of select: a parquet file or directory "
                          "(local path or URI), delta:///path/to/table or iceberg://CATALOG/namespace.table")
    _add_job_options(validate)
    sample = commands.add_parser("sample", help="write the synthetic sample corpus as a parquet directory "
                                 "or a table", description="Write the synthetic corpus (chunk_id, "
                                 "quality_score, feature_arr, text, language) to try datamask on.")
    sample.add_argument("--output", required=True, help="parquet directory to create (local path or URI), "
                        "or a delta:// / iceberg:// table URI")
    sample.add_argument("--overwrite", action="store_true",
                        help="replace --output if it exists (only an output datamask wrote)")
    _add_corpus_options(sample)
    sample.add_argument("--verbose", action="store_true", help=argparse.SUPPRESS)
    demo = commands.add_parser("demo", help="run end to end on the embedded sample corpus")
    demo.add_argument("--output", help="also write the result here (parquet directory)")
    demo.add_argument("--overwrite", action="store_true",
                      help="replace --output if an earlier datamask run wrote it")
    _add_corpus_options(demo)
    _add_job_options(demo)
    from .report.cli import add_explain_parser, add_report_parser
    from .text.cli import add_text_options, add_text_parsers

    add_report_parser(commands)
    add_explain_parser(commands)
    add_text_parsers(commands)
    add_text_options(select)
    return parser


def _add_corpus_options(parser: argparse.ArgumentParser) -> None:
    corpus = parser.add_argument_group("demo corpus")
    corpus.add_argument("--rows", type=at_least(1), default=4000, help="rows of the synthetic corpus")
    corpus.add_argument("--dim", type=at_least(2), default=64, help="embedding dimension")
    corpus.add_argument("--partitions", type=at_least(1), default=4)


_TEXT_MODEL = ("scorer", "model", "embed_batch_size", "max_tokens", "long_documents", "embed_precision")
_DASK_CLUSTER = ("scheduler", "n_workers", "threads_per_worker")
_DASK_WRITE = ("text_column", *_TEXT_MODEL)
#: Where a flag applies, when not everywhere: (what it needs, whether the command has it, the flags).
#: A flag given without what it needs is refused at once, in one line naming it; every other flag
#: applies to every input, output and engine of its command (tests/cli/test_flag_matrix.py).
_NEEDS = (
    ("an --input (--demo runs the sample corpus on Dask)", lambda a: not a.demo,
     ("engine", "spark_master", "resume", "mode", "output_columns", "incremental", "row_filter",
      *_DASK_WRITE)),
    # a bar of the partitions written: --no-progress (log lines instead) applies everywhere
    ("a select job on Dask (the one that draws the bar)",
     lambda a: a.progress is not True or (a.engine == "dask" and not a.demo), ("progress",)),
    ("--output", lambda a: a.output is not None, ("overwrite",)),
    ("no --demo (it runs on the sample corpus)", lambda a: not a.demo, ("input",)),
    ("--demo (the sample corpus's size)", lambda a: a.demo or a.command == "sample",
     ("rows", "dim", "partitions")),
    ("--engine dask (Spark runs its own executors: --spark-master names them)",
     lambda a: a.engine == "dask", _DASK_CLUSTER),
    ("--engine dask (Spark selects from the input's files as they are)",
     lambda a: a.engine == "dask", _DASK_WRITE),
    ("--engine spark", lambda a: a.engine == "spark", ("spark_master",)),
    ("--text-column", lambda a: a.text_column is not None, _TEXT_MODEL),
    ("--n-workers (the workers it starts)", lambda a: a.n_workers is not None, ("threads_per_worker",)),
    ("no --scheduler (a running scheduler's workers are its own)", lambda a: a.scheduler is None,
     ("n_workers",)),
    ("no --overwrite (--mode overwrite replaces the table)", lambda a: not a.overwrite, ("mode",)),
)
_DEFAULTS = {"demo": False, "engine": "dask", "text_column": None, "n_workers": None, "scheduler": None,
             "overwrite": False, "output": None, "progress": None}


def subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of the command ``name`` (``select``, ``demo``...)."""
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]


def given_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, str]:
    """The flags the command line gave, by destination, each as its first spelling: those whose value is
    not its command's default."""
    flags = [action for action in subcommand(parser, args.command)._actions if action.option_strings]
    return {action.dest: action.option_strings[0] for action in flags
            if getattr(args, action.dest, action.default) != action.default}


def refused_flags(args: argparse.Namespace, given: dict[str, str]) -> str | None:
    """The first rule of :data:`_NEEDS` that ``given`` flags break, as one line naming them; None: every
    given flag applies."""
    values = argparse.Namespace(**{**_DEFAULTS, **vars(args)})
    values.demo = values.demo or args.command == "demo"
    for need, holds, dests in _NEEDS:
        named = [given[dest] for dest in dests if dest in given]
        if named and not holds(values):
            return f"{' and '.join(named)} {'needs' if len(named) == 1 else 'need'} {need}"
    return None


def parse_command(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The command line, parsed: no command runs the demo, and so does ``select`` without ``--input``."""
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["demo", *argv])
    if args.command == "select" and not args.demo and args.input is None:
        if args.output is not None:
            parser.error("select: --output needs --input (or run the demo with --demo)")
        args.demo = True
    if args.command == "select" and args.input is not None and args.output is None:
        parser.error("select: --input needs --output")
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``datamask`` command; returns the exit status."""
    started = time.perf_counter()
    parser = build_parser()
    args = parse_command(parser, list(argv if argv is not None else sys.argv[1:]))
    if args.command == "report":
        from .report.cli import run_report

        return run_report(args)
    if args.command == "explain":
        from .report.cli import run_explain

        return run_explain(args)
    if args.command in ("embed", "score"):
        from .text.cli import run_text

        return run_text(args)
    options = {key: getattr(args, key) for key in FIELDS if getattr(args, key, None) is not None}
    refused = refused_flags(args, given_flags(parser, args))
    if refused is not None:
        print(f"datamask: error: {refused}", file=sys.stderr)
        return 1
    try:
        check_given(options)  # the flags' own values, before a config, the input or a heavy library
    except OptionError as exc:
        print(f"datamask: error: {as_cli_message(str(exc))}", file=sys.stderr)
        return 1
    if not args.verbose:
        _quiet_dask()
    from .progress import log_to_stderr

    log_to_stderr(args.verbose, getattr(args, "progress", None))
    # the libraries a job needs take seconds to load: someone watching is told so first (a batch log
    # starts with the planning line)
    source = getattr(args, "input", None) or "the demo corpus"
    what = f"{args.command} {source}: loading Dask, pandas and torch"
    if args.verbose:
        logging.getLogger("datamask_dask").info(what)
    elif sys.stderr.isatty():
        print(f"datamask: {what}", file=sys.stderr, flush=True)
    client = None
    with _interrupts_that_land():
        try:
            _check_input(args)
            if args.command == "select" and args.engine == "spark" and not args.demo:
                return _run_select(args, options, started)  # Spark runs its own executors: no Dask client
            if args.command == "sample":
                return _run_sample(args)
            # Every job reads through dask.dataframe: it is imported while the cluster's workers start.
            loading = threading.Thread(target=importlib.import_module, args=("dask.dataframe",), daemon=True)
            loading.start()
            client = _start_client(args)
            loading.join()
            import dask
            import dask.threaded

            # without a cluster, the threaded scheduler itself: given none (or its name), Dask imports
            # distributed to look for a client
            scheduler = dask.config.get("scheduler", None)
            if client is None and scheduler is None:
                scheduler = dask.threaded.get
            with dask.config.set(scheduler=scheduler):
                if args.command == "validate":
                    return _run_validate(args, options)
                if args.command == "demo" or args.demo:
                    _run_demo(args, options)
                else:
                    _run_select(args, options, started)
        except KeyboardInterrupt:
            print("datamask: interrupted", file=sys.stderr)
            if client is not None:  # stopped first, so that no partition finishes after it is counted
                client = _stop(client, args)
            elif "distributed.deploy.spec" in sys.modules:
                # a cluster cut off while it started cannot close (its workers are still starting), and Dask
                # would say so at exit with a traceback; multiprocessing still ends its worker processes
                import atexit

                atexit.unregister(sys.modules["distributed.deploy.spec"].close_clusters)
            _say_what_is_kept(args)
            return 130
        except Exception as exc:  # one clear line for the user; the traceback with --verbose
            exc = _storage_failure(exc, args) or exc
            unreadable = type(exc).__module__.startswith("pyarrow")  # the input is not what it claims to be
            if not unreadable and not isinstance(exc, _REPORTED):
                raise
            if args.verbose:
                traceback.print_exc()
            where = getattr(args, "input", None)
            message = f"--input {where} could not be read as parquet: {exc}" if unreadable else \
                _flag_of(exc, args) or str(exc)
            print(f"datamask: error: {as_cli_message(message)}", file=sys.stderr)
            unreachable = getattr(exc, "reason", None) in ("credentials", "endpoint", "bucket")
            if type(exc).__name__ != "ResumeError" and not unreachable:  # those say what to do
                _say_what_is_kept(args)
            return 1
        finally:
            if client is not None:
                _stop(client, args)
    return 0


def _flag_of(exc: Exception, args) -> str | None:
    """A file system's refusal (no such folder, no permission) as the local --output or --input it hit."""
    if not isinstance(exc, OSError) or not exc.filename or not exc.strerror:
        return None
    from .io.tables import parse_table_uri

    hit = os.path.abspath(os.fsdecode(exc.filename))
    for flag in ("output", "input"):
        given = getattr(args, flag, None)
        table = parse_table_uri(given) if given else None
        if table is not None and table.format != "iceberg" and "://" not in table.location:
            path = os.path.abspath(table.location)
            if os.path.commonpath([hit, path]) in (hit, path):  # the path itself, a folder above or below it
                return f"--{flag} {given}: {exc.strerror}: {hit}"
    return None


def _check_input(args) -> None:
    """A parquet --input that is not there, or an object store that cannot be reached, is told before the
    seconds of loading Dask and torch."""
    if args.command not in ("select", "validate") or getattr(args, "demo", False) or not args.input:
        return
    from .io.storage import missing, reach, resolve
    from .io.tables import parse_table_uri

    source = parse_table_uri(args.input)
    if source.format == "parquet" and not reach(where := resolve(source.location)):
        raise missing(where, f"--input {args.input}")


def _stop(client, args) -> None:
    """Leave the cluster: one the command started is shut down; a --scheduler's is only disconnected."""
    client.close() if args.scheduler else client.shutdown()


def _storage_failure(exc: Exception, args):
    """A late object-store failure (no credentials, no endpoint...) as one line naming the job's URIs."""
    from .io.storage import storage_error

    uris = [getattr(args, flag, None) for flag in ("input", "output")]
    uris = [uri for uri in uris if uri and "://" in uri and not uri.startswith("file://")]
    return storage_error(exc, " or ".join(dict.fromkeys(uris))) if uris else None


def _say_what_is_kept(args) -> None:
    """After a failed select: how many partitions finished, and how to resume or start over."""
    if args.command != "select" or not getattr(args, "output", None):
        return
    from .io.staging import finished_parts, work_location
    from .io.storage import resolve

    try:
        work = work_location(resolve(args.output))
        if not work.list():
            return
        done = finished_parts(work)
    except Exception:  # an output whose filesystem cannot be reached: nothing more to say
        return
    print(f"datamask: {done} finished partition(s) are kept in {work}: run the same command again to "
          "resume, or add --no-resume to start over", file=sys.stderr)


def _quiet_dask() -> None:
    """Keep Dask's own logs (worker tracebacks, heartbeats on shutdown) out of a clean error line."""
    import dask

    os.environ["DASK_LOGGING__DISTRIBUTED"] = "critical"  # worker processes read it when they start
    dask.config.set({"logging.distributed": "critical"})
    # asyncio's: a client's gathers cut short by Ctrl-C are reported as exceptions never retrieved
    for name in ("distributed", "distributed.worker", "distributed.nanny", "distributed.scheduler",
                 "distributed.core", "distributed.client", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _start_client(args):
    if not (args.scheduler or args.n_workers):
        return None  # Dask's threaded scheduler: distributed is not even imported
    from .cluster import SchedulerUnreachable, get_client

    if args.scheduler:
        try:
            return get_client(args.scheduler)
        except OSError as exc:  # the flag to change, with what went wrong
            reason = exc.reason if isinstance(exc, SchedulerUnreachable) else exc
            raise OSError(f"--scheduler {args.scheduler}: {reason}") from exc
    kind = "cuda" if args.device == "cuda" else "cpu"
    print(f"datamask: starting a local cluster of {args.n_workers} {kind.upper()} worker process(es)",
          file=sys.stderr, flush=True)  # seconds of silence otherwise
    client = None
    try:
        with _interrupted_once_started():
            client = get_client(kind, n_workers=args.n_workers, threads_per_worker=args.threads_per_worker,
                                dashboard_address=":0")
    except KeyboardInterrupt:
        if client is not None:  # started as the Ctrl-C came: shut down here, or it is left to the collector
            client.shutdown()
        raise
    return client


RESEND_SECONDS = 0.1  # how soon a Ctrl-C that Python swallowed is sent again


@contextlib.contextmanager
def _interrupts_that_land():
    """A Ctrl-C raised where Python swallows exceptions (in a garbage collector's callback, such as Dask's
    own, or a finaliser) goes to ``sys.unraisablehook`` instead of the command, and the job would run
    on to its end: it is sent again, :data:`RESEND_SECONDS` later, once that code has returned."""
    previous, ended = sys.unraisablehook, threading.Event()

    def resend() -> None:
        if not ended.is_set():
            os.kill(os.getpid(), signal.SIGINT)

    def hook(unraisable) -> None:
        if not issubclass(unraisable.exc_type, KeyboardInterrupt):
            return previous(unraisable)
        timer = threading.Timer(RESEND_SECONDS, resend)
        timer.daemon = True
        timer.start()

    sys.unraisablehook = hook
    try:
        yield
    finally:
        ended.set()
        sys.unraisablehook = previous


@contextlib.contextmanager
def _interrupted_once_started():
    """A Ctrl-C while the worker processes start is raised once they have started, or failed to (a
    terminal's Ctrl-C reaches them too): a process still being spawned when the command exits cannot
    read what its parent sends it, and prints a traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda number, frame: caught.append(number))
    try:
        yield
    except Exception:
        if caught:  # the workers stopped by the same Ctrl-C
            raise KeyboardInterrupt from None
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def _run_select(args, options: dict, started: float) -> int:
    """``datamask select``: one call of the one door (:func:`datamask_dask.run.tables.select_table`)
    whatever the input, output and engine."""
    from .io.storage import resolve
    from .io.tables import parse_table_uri
    from .run.tables import select_table

    source, target = parse_table_uri(args.input), parse_table_uri(args.output)
    where = resolve(source.location) if source.format == "parquet" else None  # there: _check_input
    # a file input gives a file output (parquet in and out, on Dask), unless the output is named as a
    # directory (a trailing slash) or is one already
    single_file = (where is not None and where.isfile() and target.format == "parquet"
                   and args.engine == "dask" and not args.output.endswith(("/", os.sep))
                   and not resolve(target.location).isdir())
    spark = None
    if args.engine == "spark":
        try:
            from datamask_spark.job import get_spark
        except ImportError as exc:
            raise OptionError("--engine spark needs pyspark: pip install 'datamask-dask[spark]'") from exc
        if not args.verbose:  # PySpark's caution about pandas 3, on which the package's Spark path is tested
            warnings.filterwarnings("ignore", "PySpark does not yet fully support pandas", FutureWarning)
        progress = args.progress if args.progress is not None else sys.stderr.isatty()
        # started once the output and the input are checked: a refusal does not wait for a JVM
        spark = functools.partial(get_spark, args.spark_master, progress=progress, quiet=not args.verbose)
    report = select_table(
        args.input, args.output, engine=args.engine, spark=spark, config=args.config,
        output_columns=args.output_columns, mode=args.mode or ("overwrite" if args.overwrite else "error"),
        incremental=args.incremental, row_filter=args.row_filter, resume=args.resume, single_file=single_file,
        progress=args.progress, prepare=_text_columns(args), backend=_backend(args), **options)
    read = report.source
    if not report.run_id:  # an incremental run found no rows added since the last
        print(f"datamask: no rows were added to {args.input} since version {read['since']}: nothing to "
              f"select, {report.output} is unchanged")
        return 0
    since = f" (rows added since {read['since']})" if read.get("since") is not None else ""
    at = f" at {read['version']}" if read.get("version") is not None else ""
    resumed = f", {len(report.reused)} of {len(report.reused) + len(report.computed)} partitions " \
              "reused from the interrupted run" if report.reused else ""
    profile = report.record["profile"]
    on = " (spark)" if args.engine == "spark" else ""
    share, whole = report.selected / max(report.rows, 1), time.perf_counter() - started
    print(f"datamask: {report.rows} rows, {report.selected} selected ({share:.1%}) of {args.input}{at}"
          f"{since} in {report.seconds:.1f} s ({whole:.1f} s with start-up){resumed}, profile {profile} -> "
          f"{report.output}{on}")
    return 0


def _text_columns(args):
    """With --text-column: a function that computes the embedding and quality columns the input lacks,
    once (persisted: both passes read them), for every kind of input and output; else None."""
    if not getattr(args, "text_column", None):
        return None
    from .text.cli import fill_text_columns

    return lambda ddf: fill_text_columns(ddf, args).persist()


def _backend(args) -> str:
    """cuDF partitions (read, learned and written on the GPU) for --device cuda where cuDF is installed."""
    import importlib.util

    wants_gpu = str(args.device or "").startswith("cuda")
    return "cudf" if wants_gpu and importlib.util.find_spec("cudf") is not None else "pandas"


def _run_sample(args) -> int:
    import dask.dataframe as dd
    import numpy as np

    from .io.sinks import write_parquet
    from .io.tables import parse_table_uri, write_table_output
    from .sample_data import make_corpus

    corpus = make_corpus(args.rows, args.dim, seed=0)
    corpus["language"] = np.where(corpus["chunk_id"] % 3 == 0, "de", "en")  # a group column for by=
    frame = dd.from_pandas(corpus, npartitions=args.partitions, sort=False)  # fewer where rows are fewer
    if parse_table_uri(args.output).format == "parquet":
        write_parquet(frame, args.output, overwrite=args.overwrite)
    else:  # a table to try the lakehouse inputs on
        try:
            write_table_output(frame, args.output, mode="overwrite" if args.overwrite else "error",
                               record={"tool": "datamask-dask", "kind": "sample"})
        except FileExistsError as exc:  # the sink names --mode, which sample does not have
            raise FileExistsError(f"{args.output} exists; pass --overwrite to replace it (only a table "
                                  "datamask wrote is replaced)") from exc
    print(f"datamask sample: {args.rows} rows, {args.dim}-d embeddings, {frame.npartitions} files -> "
          f"{args.output}")
    return 0


def _run_validate(args, options: dict) -> int:
    """``datamask validate``: the checks and quota planning of any input ``select`` reads."""
    from .dask_engine.validate import validate_table
    from .io.tables import read_table

    frame = read_table(args.input, backend=_backend(args)).frame
    report = validate_table(frame, config=args.config, **options)
    print(f"datamask validate: {args.input}: {as_cli_message(report.summary())}",
          file=sys.stdout if report.ok else sys.stderr)
    if report.ok and report.selection():
        print(f"datamask validate: {report.selection()}")
    return 0 if report.ok else 1


def _run_demo(args, options: dict) -> None:
    import dask.dataframe as dd

    from .config import resolve_options
    from .dask_engine.operator import datamask_select
    from .learn.yardstick import measure
    from .partition.adapters import embedding_matrix
    from .sample_data import make_corpus

    rows, dim, n_parts = args.rows, args.dim, args.partitions
    resolved = resolve_options(args.config, backend="pandas", **options)
    print(f"datamask demo: synthetic corpus of {rows} rows, {dim}-d embeddings, {n_parts} partitions")
    corpus = make_corpus(rows, dim, seed=0)
    source = dd.from_pandas(corpus, npartitions=n_parts)
    start = time.perf_counter()
    if args.output:  # a selection's output, with its run record: `datamask report` and `explain` read it
        from .io.parquet import read_parquet
        from .run.selection import write_selection

        write_selection(source, args.output, config=resolved, overwrite=args.overwrite)
        ids, column = resolved.id_column, resolved.selected_column
        written = read_parquet(args.output, columns=[ids, column]).compute()
        mask = corpus[ids].isin(written.loc[written[column].astype(bool), ids]).to_numpy()
    else:
        mask = datamask_select(source, config=resolved).compute()[resolved.selected_column].to_numpy()
    elapsed = time.perf_counter() - start
    k = int(mask.sum())
    print(f"selected {k} of {len(corpus)} rows ({k / len(corpus):.1%}) in {elapsed:.1f} s")
    if 0 < k < len(corpus):
        score = measure(corpus["quality_score"].to_numpy(copy=True), embedding_matrix(corpus["feature_arr"]),
                        mask, algorithm=resolved.learner.algorithm, lamb=resolved.learner.lamb)
        print(f"objective (lamb={resolved.learner.lamb}, {resolved.learner.algorithm}), higher is better: "
              f"{score.objective:.4f}, {score.share:.1%} of {score.baseline_name}'s gain over random "
              f"({score.baseline:.4f} against {score.random:.4f}); quality top-k {score.topk:.4f}, "
              f"{score.topk_share:.1%}")
    if args.output:
        print(f"written to {args.output} (datamask report {args.output} draws it)")


if __name__ == "__main__":
    sys.exit(main())
