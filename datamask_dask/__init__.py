"""datamask-dask: DATAMASK data selection (quality + diversity, policy-gradient mask learning)
for Dask dataframes, pandas or cuDF partitions, on CPU or GPU.

    out = ddf.pipe(datamask_select, ratio=0.1)   # lazy; adds a boolean `selected` column

The package reads as its pipeline, one direction of imports (each room uses only those below it):

    cli, cluster        the command line and Dask clusters
    report/             the HTML report of a finished run (matplotlib), datamask explain
    text/               from raw text: embed and score_quality, in the same dataframe style
    run/                one run from source to sink: work area, markers, resume, summary, record, commit
    dask_engine/        the Dask engine: datamask_select and validate_table as Dask graphs, a run's tasks
    io/                 parquet, Delta and Iceberg in and out, sinks, output safety, storage URIs
    partition/          one partition (pandas or cuDF): adapters, spec, checks, the select step
    dedup/              table-wide near-duplicates: signatures, stages, each engine's wiring
    plan/               quotas, memory checks, the reduction to one typed plan (no Dask, no Spark)
    learn/              the learner on one chunk: torch and numpy only, no dataframe
    config, options     the options of a selection (resolved once per run), and their defaults
    errors              exceptions, used everywhere

The Spark engine is ``datamask_spark`` (integrations/), on the same rooms.

Public names are imported on first use, so ``import datamask_dask.learn`` loads neither pandas,
Dask nor pyarrow.
"""

import lazy_loader

__version__ = "0.1.0"

__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "cluster": ["get_client"],
    "config": ["load_config", "resolve_options"],
    "options": ["SelectOptions"],
    "dask_engine.operator": ["datamask_select"],
    "dask_engine.validate": ["ValidationReport", "validate_table"],
    "io.parquet": ["read_parquet"],
    "io.sinks": ["write_parquet"],
    "run.selection": ["SelectionReport", "write_selection"],
    "run.work": ["ResumeError"],
    "run.summary": ["RunSummary"],
    "run.tables": ["TableRunReport", "select_table"],
    "io.tables": ["read_table", "selected_counts", "write_table_output"],
    "io.delta": ["read_delta", "write_delta"],
    "io.iceberg": ["read_iceberg", "write_iceberg"],
    "report.build": ["build_report"],
    "text.embedding": ["embed"],
    "text.quality": ["heuristic_scores", "score_quality"],
    "learn.engine": ["MaskResult", "learn_mask"],
    "learn.metrics": ["DiversityMetric", "evaluate_selection", "register_metric"],
    "learn.options": ["DataMaskOptions"],
    "learn.baselines": ["DEFAULT_MAX_MEMORY", "graph_lazy_greedy", "greedy", "lazy_greedy", "quality_topk",
                        "random_selection", "stochastic_greedy"],
    "partition.adapters": ["embedding_matrix"],
    "sample_data": ["make_corpus", "make_embeddings"],
    "errors": ["DataMaskError", "DataMaskWarning", "InputDataError", "OptionError", "StorageError"],
})
