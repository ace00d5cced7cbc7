"""``build_report(OUTPUT, OUT_DIR)``: an HTML page and the PNGs it shows, from a finished selection.

Everything comes from the output itself: its run record (:class:`datamask_dask.run.summary.RunSummary`)
and a sample of its rows (whole row groups at random, as the run summary samples them). The
page is one self-contained file (images inlined as base64 ``data:`` URIs, no scripts, no network);
the same images are written next to it as PNG files.

The figures (:data:`FIGURES`, captioned in ``_CAPTIONS``) are drawn on matplotlib's Agg canvas,
without pyplot: the caller's backend is left alone. The projection shows the selection next to
quality top-k of as many rows: quality-only selection clusters, joint selection spreads out.
"""

from __future__ import annotations

import base64
import html
import io
import os
import posixpath
from pathlib import Path

import numpy as np
import pandas as pd

from ..io.output import UnsafeOutputError
from ..io.parquet import read_row_groups
from ..io.storage import Location, reach, resolve, storage_errors
from ..io.tables import parse_table_uri, read_table
from ..options import TEXT_COLUMN
from ..run.summary import YARDSTICK_ROWS, RunSummary, unit_rows
from .audit import data_files, output_record, quality_of

SAMPLE_ROWS = 5_000  # rows read for the quality and projection figures
MAX_TABLE_ROWS = 200  # rows shown of the per-partition and per-group tables
MAX_BARS = 30  # groups drawn in the quotas figure: the largest, so that their names stay legible
FIGURES = ("curves", "quality", "projection", "objective", "quotas")
_SELECTED, _OTHER, _TOPK = "#d62728", "#9e9e9e", "#1f77b4"
_TITLE = "datamask selection report: "  # also how an earlier report's page is known


def build_report(output_path: str | os.PathLike, out_dir: str | os.PathLike, *,
                 sample_rows: int = SAMPLE_ROWS, seed: int = 0, embed: bool = True,
                 text_column: str = TEXT_COLUMN) -> Path | str:
    """Write ``index.html`` and the figures' PNGs for the datamask output ``output_path`` into ``out_dir``.

    ``output_path``: a directory or single file written by :func:`datamask_dask.write_selection`
    (``datamask select``), local or a URI (``s3://``...), or a Delta / Iceberg table URI written by
    ``datamask select``: it must carry a run record (in the commit or snapshot for tables).
    ``out_dir`` is created if missing (local or a URI) and may not lie inside ``output_path`` (the
    output holds only the files its run wrote). ``sample_rows`` rows of the output (drawn with
    ``seed``) make the quality histogram and the projection. ``embed`` inlines the images (base64)
    so the HTML file stands alone; else the page links the PNGs next to it. ``text_column``: the
    column whose snippets the audit of an explained output shows beside its rows, where it has one.

    Returns the HTML page: a local path, or its URI on an object store.
    """
    table = parse_table_uri(output_path)
    target = resolve(out_dir)
    summary = RunSummary(output_record(output_path))
    source = table
    if table.format == "parquet":
        source = resolve(table.location)
        inside = (type(source.fs) is type(target.fs) and source.isdir()
                  and (target.path.rstrip("/") + "/").startswith(source.path.rstrip("/") + "/"))
        if inside:
            raise ValueError(f"the report directory {target} lies inside the output {source}: write it "
                             "elsewhere (a datamask output holds only the files its run wrote)")
    reach(target)  # a store that cannot be reached, or a missing bucket, told in one line
    _check_report_dir(target)
    target.makedirs()
    sample = _sample(source, summary, sample_rows, seed)
    draws = (_curves, _quality, _projection, _objective, _quotas)
    figures = {name: draw(summary, sample) for name, draw in zip(FIGURES, draws, strict=True)}
    with storage_errors(target, writing=True):
        for name, png in figures.items():
            target.child(f"{name}.png").write_bytes(png)
    page = target.child("index.html")
    name = posixpath.basename(table.location.rstrip("/"))
    audited = None
    if summary.run.options.explain:  # its small columns and text, read whole
        from .audit import audit, explained_columns, read_output

        options = summary.run.options
        frame = read_output(output_path, explained_columns(options) + [text_column], summary.record)
        audited = audit(frame, options, seed=seed, text_column=text_column)
    with storage_errors(target, writing=True):
        page.write_bytes(_html(summary, sample, figures, embed, name, audited).encode("utf-8"))
    return Path(page.path) if page.local else page.uri


def _check_report_dir(target: Location) -> None:
    """A report is written into a new directory or over an earlier report: a directory that holds
    anything else (another page, someone's files, a datamask output) is not written into."""
    if target.isfile():
        raise UnsafeOutputError(f"the report directory {target} is a file: choose a new or empty directory")
    if not target.isdir():
        return
    others = sorted(set(target.list()) - {"index.html", *(f"{name}.png" for name in FIGURES)})
    page = target.child("index.html")
    if not others and page.exists() and _TITLE.encode() not in page.read_bytes()[:512]:
        others = ["index.html"]  # a page, but not a report's
    if others:
        shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
        raise UnsafeOutputError(f"the report directory {target} holds files a report does not write "
                                f"({shown}): choose a new or empty directory (--out); a report replaces only "
                                "an earlier report's files")


# --------------------------------------------------------------------------- data


def _table_sample(table, columns: list[str], n: int, seed: int) -> pd.DataFrame:
    """About ``n`` random rows of a Delta or Iceberg output (the same share of every data file)."""
    frame = read_table(table).frame
    if any(c not in frame.columns for c in columns):  # a selection-only output has no embeddings
        return pd.DataFrame()
    frame = frame[columns]
    rows = len(frame[columns[-1]])  # counted on one small column
    if rows == 0:
        return frame._meta
    return frame.sample(frac=min(1.0, n / rows), random_state=seed).compute(scheduler="threads")


def _sample(source, summary: RunSummary, n: int, seed: int) -> dict:
    """The sample's quality, unit embeddings and selection mask (empty arrays when unreadable)."""
    options = summary.run.options
    embedding, selected = options.embedding_column, options.selected_column
    wanted = [*(c for c, _ in options.quality), embedding, selected]
    if n <= 0:
        frame = pd.DataFrame()
    elif isinstance(source, Location):
        frame = read_row_groups(data_files(source, summary.record), wanted, n, seed)
    else:
        frame = _table_sample(source, wanted, n, seed)
    out = {"rows": len(frame), "quality": np.zeros(0), "selected": np.zeros(0, dtype=bool),
           "embeddings": None}
    if not len(frame) or any(c not in frame.columns for c in wanted):
        return out
    out["quality"] = quality_of(frame, options)
    out["selected"] = frame[selected].to_numpy(dtype=bool)
    out["embeddings"] = unit_rows(frame[embedding])
    return out


# --------------------------------------------------------------------------- figures


def _png(figure) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    buffer = io.BytesIO()
    figure.tight_layout()
    FigureCanvasAgg(figure).print_png(buffer)
    return buffer.getvalue()


def _figure(width=7.0, height=4.0, ncols=1):
    """A figure on the Agg canvas, outside pyplot: no global backend change, no figure manager."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100)
    return figure, figure.subplots(1, ncols, squeeze=False)


def _curves(summary: RunSummary, sample: dict) -> bytes:
    curves = summary.summary.get("curves", [])[:8]
    figure, axes = _figure()
    ax = axes[0, 0]
    for curve in curves:
        ax.plot(curve["step"], curve["objective"], label=f"{curve['chunk']} ({curve['steps']} steps)")
    if curves:
        ax.legend(fontsize=7, loc="lower right")
    else:
        ax.text(0.5, 0.5, "no learner run recorded\n(every quota was 0 or took a whole chunk)",
                ha="center", va="center", transform=ax.transAxes)
    ax.set(xlabel="step", ylabel="mean objective of the rollouts", title="Learning curves (first chunks)")
    ax.grid(alpha=0.3)
    return _png(figure)


def _quality(summary: RunSummary, sample: dict) -> bytes:
    quality, selected = sample["quality"], sample["selected"]
    figure, axes = _figure()
    ax = axes[0, 0]
    if len(quality):
        bins = np.histogram_bin_edges(quality, bins=40)
        ax.hist(quality, bins=bins, color=_OTHER, alpha=0.7, density=True, label=f"all ({len(quality)})")
        if selected.any():
            ax.hist(quality[selected], bins=bins, color=_SELECTED, alpha=0.6, density=True,
                    label=f"selected ({int(selected.sum())})")
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no rows sampled", ha="center", va="center", transform=ax.transAxes)
    ax.set(xlabel="quality", ylabel="density",
           title=f"Quality: all vs selected (sample of {sample['rows']} rows)")
    return _png(figure)


def pca_2d(embeddings: np.ndarray) -> np.ndarray:
    """The rows' coordinates on the first two principal components (numpy SVD)."""
    centred = embeddings - embeddings.mean(0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    return centred @ vt[:2].T


def _projection(summary: RunSummary, sample: dict) -> bytes:
    embeddings, selected, quality = sample["embeddings"], sample["selected"], sample["quality"]
    figure, axes = _figure(11.0, 4.8, ncols=2)
    if embeddings is None or len(embeddings) < 3:
        axes[0, 0].text(0.5, 0.5, "no embeddings sampled", ha="center", va="center",
                        transform=axes[0, 0].transAxes)
        return _png(figure)
    xy = pca_2d(embeddings)
    k = int(selected.sum())
    topk = np.zeros(len(quality), dtype=bool)
    topk[np.argsort(-quality, kind="stable")[:k]] = True
    for ax, mask, colour, title in ((axes[0, 0], selected, _SELECTED, f"DATAMASK selection ({k} rows)"),
                                    (axes[0, 1], topk, _TOPK, f"quality top-k ({k} rows)")):
        ax.scatter(xy[~mask, 0], xy[~mask, 1], s=4, c=_OTHER, alpha=0.4, label="not selected", linewidths=0)
        ax.scatter(xy[mask, 0], xy[mask, 1], s=8, c=colour, alpha=0.9, label="selected", linewidths=0)
        ax.set(title=title, xlabel="PC 1", ylabel="PC 2")
        ax.legend(loc="upper right", fontsize=8, markerscale=2)
    figure.suptitle(f"Embeddings, 2-D PCA (sample of {len(xy)} rows)")
    return _png(figure)


def _objective(summary: RunSummary, sample: dict) -> bytes:
    table = summary.to_pandas("objective")
    figure, axes = _figure()
    ax = axes[0, 0]
    if table.empty:
        ax.text(0.5, 0.5, "no objective recorded (no rows selected in the sample)", ha="center",
                va="center", transform=ax.transAxes)
        return _png(figure)
    terms = ["objective", "quality", "diversity"]
    x = np.arange(len(terms))
    width = 0.8 / len(table)
    colours = {"datamask": _SELECTED, "quality_topk": _TOPK, "random": _OTHER}
    for i, (name, row) in enumerate(table.iterrows()):
        bars = ax.bar(x + (i - (len(table) - 1) / 2) * width, [row[t] for t in terms], width,
                      label=name, color=colours.get(name))
        ax.bar_label(bars, fmt="%.3f", fontsize=7)
    ax.set_xticks(x, terms)
    algorithm, lamb = summary.summary.get("algorithm"), summary.summary.get("lamb")
    ax.set_title(f"Objective vs baselines on the sample ({algorithm}, lamb={lamb})")
    ax.legend(fontsize=8)
    return _png(figure)


def _quotas(summary: RunSummary, sample: dict) -> bytes:
    from matplotlib.ticker import MaxNLocator

    parts = summary.to_pandas("partitions")
    groups = summary.to_pandas("groups") if summary.summary.get("by") else pd.DataFrame()
    figure, axes = _figure(11.0 if len(groups) else 7.0, 4.0, ncols=2 if len(groups) else 1)
    ax = axes[0, 0]
    ax.bar(parts["partition"], parts["share"], color=_SELECTED, width=0.8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.set(xlabel="partition", ylabel="selected share", title="Selected share per partition")
    if len(groups):
        ax = axes[0, 1]
        shown = groups.nlargest(MAX_BARS, "rows").sort_index() if len(groups) > MAX_BARS else groups
        ax.bar([str(g) for g in shown["group"]], shown["share"], color=_TOPK)
        title = "Selected share per group" if len(shown) == len(groups) else \
            f"Selected share of the {len(shown)} largest of {len(groups)} groups"
        ax.set(xlabel="group", title=title)
        ax.tick_params(axis="x", labelrotation=45)
    return _png(figure)


# --------------------------------------------------------------------------- page


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1150px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
figure { margin: 1em 0; } img { max-width: 100%; border: 1px solid #eee; }
.note { color: #666; font-size: 0.85em; }
.audit-group td:last-child { text-align: left; }
"""

# Why a larger output's report has no yardstick, and what its sample understates.
_NO_YARDSTICK = (f"The share of greedy's gain is measured where the output has at most {YARDSTICK_ROWS:,} "
                 "rows, on all of them: greedy run on a sample picks for the sample, where a selection "
                 "made for the whole table (greedy's own too) scores low. Score a larger table's rows with "
                 "datamask_dask.learn.yardstick.measure.")
_COVERAGE_SAMPLED = ("Facility's coverage is understated on a sample: each sampled row is covered only by "
                     "the picks that are in the sample too, not by the nearest pick of the table.")

_CAPTIONS = {
    "curves": "Learning curves: mean objective of the sampled masks per learner step, first chunks.",
    "quality": "Quality distribution of all rows and of the selected rows (densities, on a sample).",
    "projection": "2-D PCA projection of the embeddings: the selection against quality top-k of as many "
                  "rows.",
    "objective": "Objective, quality term and diversity term of the selection vs quality top-k and random.",
    "quotas": "Selected share per partition (and per group).",
}


def _table(frame: pd.DataFrame, limit: int | None = None) -> str:
    note = ""
    if limit is not None and len(frame) > limit:
        note = f'<p class="note">First {limit} of {len(frame)} rows.</p>'
        frame = frame.head(limit)
    return frame.to_html(index=False, escape=True, float_format=lambda v: f"{v:.4g}", na_rep="") + note


def _audit_html(audited: dict) -> list[str]:
    """The report's audit section: counts per reason, near-duplicate groups kept vs set aside."""
    counts = pd.DataFrame({"reason": list(audited["counts"]), "rows": list(audited["counts"].values())})
    counts["share"] = counts["rows"] / max(audited["rows"], 1)
    share = audited["kept_best_share"]
    parts = ["<section id='audit'><h2>Audit: why each row was selected, or not</h2>",
             _table(counts),
             f"<p id='audit-groups'>{audited['groups']} near-duplicate groups; the kept row is the best by "
             f"quality in <b>{audited['kept_best']}</b> of them"
             + (f" ({share:.1%})" if share is not None else "")
             + f"; {audited['kept_selected']} kept rows are selected.</p>"]
    if audited["sample"]:
        parts.append("<h3>Near-duplicate groups: kept vs set aside (a sample)</h3>")
    for number, group in enumerate(audited["sample"]):
        rows = [{"role": "kept", **group["kept"]}] + [{"role": "set aside", **r} for r in group["set_aside"]]
        frame = pd.DataFrame(rows).drop(columns=["duplicate_of"], errors="ignore")
        parts.append(f"<div class='audit-group' id='audit-group-{number}'>{_table(frame)}</div>")
    parts.append("</section>")
    return parts


def _html(summary: RunSummary, sample: dict, figures: dict, embed: bool, name: str,
          audited: dict | None = None) -> str:
    run = summary.run
    rows, selected = run.rows, run.selected
    title = f"{_TITLE}{name}"
    parts = ["<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>",
             f"<title>{html.escape(title)}</title>",
             f"<style>{_CSS}</style></head><body>", f"<h1>{html.escape(title)}</h1>",
             f"<p>{rows} rows, <b>{selected}</b> selected ({selected / max(rows, 1):.1%}), "
             f"{len(run.partitions)} partitions; run {html.escape(run.run_id)} "
             f"finished {html.escape(run.finished)}.</p>"]

    def figure(name):
        inline = "data:image/png;base64," + base64.b64encode(figures[name]).decode()
        src = inline if embed else f"{name}.png"
        return (f"<figure><img src=\"{src}\" alt=\"{name}\" id=\"fig-{name}\">"
                f"<figcaption class='note'>{html.escape(_CAPTIONS[name])}</figcaption></figure>")

    parts += ["<h2>Objective vs baselines</h2>", figure("objective")]
    yardstick = summary.summary.get("yardstick")
    if yardstick and yardstick["rows"] != rows:  # a record of an earlier version, scored on a sample
        yardstick = None
    sampled = summary.summary.get("sample") or {}
    if yardstick:
        parts.append(
            f"<p id='yardstick'>On every row of the output, the selection reaches "
            f"<b>{yardstick['share']:.1%}</b> of {html.escape(yardstick['baseline_name'])}'s gain over a "
            f"random pick (objective {yardstick['objective']:.5f}, random {yardstick['random']:.5f}, "
            f"{html.escape(yardstick['baseline_name'])} {yardstick['baseline']:.5f}); quality top-k reaches "
            f"{yardstick['topk_share']:.1%} ({yardstick['topk']:.5f}).</p>")
    objective = summary.to_pandas("objective")
    if not objective.empty:
        threshold = summary.summary.get("duplicate_cosine")
        parts += [_table(objective.reset_index()),
                  f"<p class='note'>On a sample of {sampled.get('rows')} output rows; "
                  f"near-duplicate pairs: cosine &ge; {threshold} among each pick's rows.</p>"]
        if sampled.get("whole") is False and run.options.learner.metric == "facility":
            parts.append(f"<p class='note' id='coverage-sampled'>{html.escape(_COVERAGE_SAMPLED)}</p>")
    if not yardstick and rows > YARDSTICK_ROWS:
        parts.append(f"<p class='note' id='no-yardstick'>{html.escape(_NO_YARDSTICK)}</p>")
    if audited is not None:
        parts += _audit_html(audited)
    parts += ["<h2>Learning curves</h2>", figure("curves"),
              "<h2>Quality</h2>", figure("quality"),
              "<h2>Embeddings</h2>", figure("projection"),
              "<h2>Quotas</h2>", figure("quotas"),
              "<h3>Per partition</h3>", _table(summary.to_pandas("partitions"), MAX_TABLE_ROWS)]
    if summary.summary.get("by"):
        parts += [f"<h3>Per group ({html.escape(str(summary.summary['by']))})</h3>",
                  _table(summary.to_pandas("groups"), MAX_TABLE_ROWS)]
    parts += ["<h2>Run</h2>", _table(summary.to_pandas("overview")),
              "<h3>Settings</h3>", _table(summary.to_pandas("settings")),
              "<h3>Versions</h3>", _table(summary.to_pandas("versions")),
              "</body></html>\n"]
    return "\n".join(p for p in parts if p)
