"""Bounded memory: the budget option, its default, the sizes derived from it, and the peak resident
memory of a partition larger than the budget (measured in a fresh process)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import dask.dataframe as dd
import numpy as np
import pytest

from datamask_dask import OptionError, datamask_select
from datamask_dask.config import resolve_options
from datamask_dask.dask_engine.operator import plan_selection
from datamask_dask.learn.options import DataMaskOptions
from datamask_dask.options import chunk_rows
from datamask_dask.plan.memory import (
    ROW_BYTES,
    WORKER_SHARE,
    _process_memory,
    check_memory,
    chunk_bytes,
    metric_kinds,
    parse_budget,
    plan_memory,
    resolve_budget,
)
from datamask_dask.sample_data import make_corpus

BUDGET = 24 * 2**20

# Peak resident memory of one selection, above the process's resident memory once the data are
# loaded and the libraries warmed up. Linux resets the peak ("VmHWM") when 5 is written to
# /proc/self/clear_refs; where that is not allowed, a thread samples the resident size instead.
SCRIPT = r"""
import json, sys, threading, time
import dask.dataframe as dd, numpy as np, pandas as pd, psutil, pyarrow as pa
from datamask_dask import datamask_select
from datamask_dask.dask_engine.operator import plan_selection
from datamask_dask.plan.memory import plan_memory

n, d, budget, algorithm = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
# 200k-row chunks (the built-in default; the cpu profile's 10k-row chunks would bound memory anyway).
# memory_budget bounds the select tasks; the partition scope keeps the plan pass's table-wide
# near-duplicate step (its own tasks, sized by the table, not the budget) out of this measure.
options = dict(ratio=0.1, n_epochs=3, refine_epochs=3, n_rollout=4, max_chunk_rows=200_000,
               diversity_scope="partition", algorithm=algorithm)
rng = np.random.default_rng(0)
vectors = pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(n * d, dtype=np.float32)), d)
frame = pd.DataFrame({"chunk_id": np.arange(n), "quality_score": rng.random(n),
                      "feature_arr": pd.arrays.ArrowExtensionArray(vectors)})
del vectors
process = psutil.Process()

def peak_of(run):
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        resettable = True
    except OSError:
        resettable = False
    base = process.memory_info().rss
    samples, done = [base], threading.Event()
    def sample():
        while not done.is_set():
            samples.append(process.memory_info().rss)
            time.sleep(0.001)
    sampler = None if resettable else threading.Thread(target=sample, daemon=True)
    if sampler:
        sampler.start()
    value = run()
    done.set()
    if sampler:
        sampler.join()
    peak = max(samples)
    if resettable:
        status = dict(line.split(":", 1) for line in open("/proc/self/status"))
        peak = int(status["VmHWM"].split()[0]) * 1024
    return peak - base, value

def select(memory_budget):
    ddf = dd.from_pandas(frame, npartitions=1, sort=False)
    return int(datamask_select(ddf, memory_budget=memory_budget, **options)["selected"].sum()
               .compute(scheduler="sync"))

warm = dd.from_pandas(frame.iloc[:3000], npartitions=1, sort=False)  # loads torch and its kernels
datamask_select(warm, **options)["selected"].sum().compute(scheduler="sync")
spec, _ = plan_selection(dd.from_pandas(frame, npartitions=1, sort=False), memory_budget=budget, **options)
sizes = plan_memory(spec.memory_budget, n, d, spec.options, spec.max_chunk_rows)
bounded = peak_of(lambda: select(budget))
unbounded = peak_of(lambda: select("off"))
print(json.dumps({"partition_bytes": int(frame.memory_usage(deep=True).sum()),
                  "chunk_rows": sizes.max_chunk_rows, "bounded": bounded, "unbounded": unbounded}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["Pair_simi", "Facility"])
def test_a_partition_larger_than_the_budget_stays_under_it(algorithm):
    n, d = 40_000, 192
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(n), str(d), str(BUDGET), algorithm],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["partition_bytes"] > BUDGET  # the partition alone is larger than the budget
    assert result["chunk_rows"] < n // 4  # so it is learned in chunks...
    extra, selected = result["bounded"]
    assert selected == round(0.1 * n)
    assert extra <= BUDGET, f"peak {extra / 2**20:.1f} MiB above the baseline, budget {BUDGET / 2**20} MiB"
    print(f"{algorithm}: chunks of {result['chunk_rows']} rows, peak {extra / 2**20:.1f} MiB")
    # ...and that is what keeps it down: the same selection without a budget goes far above it.
    extra_unbounded, selected = result["unbounded"]
    assert selected == round(0.1 * n) and extra_unbounded > 2 * BUDGET


def test_parse_budget():
    assert parse_budget("2GiB") == 2 * 2**30
    assert parse_budget(50_000_000) == 50_000_000
    assert parse_budget(None) is None and parse_budget("auto") is None
    assert parse_budget("off") == 0
    for bad in ("lots", -1, 1000, True, 1.5e6 + 0.5, [1]):
        with pytest.raises(OptionError, match="memory_budget"):
            parse_budget(bad)


@pytest.mark.parametrize("algorithm", ["Pair_simi", "DiSF", "Facility", {"Facility": 0.5, "DiSF": 0.5}])
def test_sizes_follow_the_budget(algorithm):
    options = DataMaskOptions(algorithm=algorithm, n_rollout=64)
    assert plan_memory(None, 10**6, 768, options, 200_000) == plan_memory(0, 10**6, 768, options, 200_000)
    assert plan_memory(None, 10**6, 768, options, 200_000).options is options
    n_rows, dim, budget = 10**6, 768, 2 * 2**30
    sizes = plan_memory(budget, n_rows, dim, options, 200_000)
    assert 2 <= sizes.max_chunk_rows < 200_000
    lowered = sizes.options
    assert lowered.rollout_chunk <= options.rollout_chunk and lowered.reference_size <= options.reference_size
    assert lowered.n_epochs == options.n_epochs and lowered.seed == options.seed  # nothing else changes
    need = chunk_bytes(sizes.max_chunk_rows, dim, lowered, min(lowered.rollout_chunk, lowered.n_rollout),
                       lowered.reference_size, lowered.refine_reference, metric_kinds(lowered))
    assert n_rows * ROW_BYTES + need <= budget
    bigger = plan_memory(4 * budget, n_rows, dim, options, 200_000)
    assert bigger.max_chunk_rows >= sizes.max_chunk_rows
    # A generous budget changes nothing.
    assert plan_memory(2**40, 1000, 16, options, 200_000) == plan_memory(None, 1000, 16, options, 200_000)


def test_too_small_a_budget_says_what_to_do():
    with pytest.raises(OptionError, match=r"too small for a partition of 1000000 rows.*repartition"):
        plan_memory(2**20, 10**6, 768, DataMaskOptions(), 200_000)


@pytest.mark.parametrize("algorithm", ["Facility", "Pair_simi", "DiSF"])
def test_a_default_chunk_fits_a_worker_thread_of_4_gib(algorithm):
    """Dask's share of a 16-core, 64 GiB machine (4 workers of 4 threads: 4 GiB a thread), at d = 768."""
    options, dim = resolve_options(algorithm=algorithm), 768
    rows = chunk_rows(options.max_chunk_rows, options.max_chunk_values, dim)  # one default chunk
    check_memory(int(WORKER_SHARE * 4 * 2**30), rows, dim, options.learner, rows)
    with pytest.raises(OptionError, match="the workers' memory is too small"):  # a worker with less is not
        check_memory(int(WORKER_SHARE * 2**30 / 4), rows, dim, options.learner, rows)


def test_a_refusal_names_the_chunk_that_fits_or_smaller_partitions():
    """The rows a worker holds of its partition count whatever the chunks: where they leave room for a
    chunk, the refusal names the largest that fits (and the check passes with it); where they do not,
    it says to split the partitions. A pack gathers rows up to a chunk, so a smaller chunk always
    helps it."""
    options, limit = resolve_options(algorithm="Facility").learner, 2**30
    with pytest.raises(OptionError, match=r"max_chunk_rows=\d+") as caught:
        check_memory(limit, 400_000, 64, options, 400_000)
    fits = int(re.search(r"max_chunk_rows=(\d+)", str(caught.value)).group(1))
    check_memory(limit, 400_000, 64, options, fits)
    with pytest.raises(OptionError, match="max_chunk_rows="):
        check_memory(limit, 400_000, 64, options, fits + 1)
    with pytest.raises(OptionError, match=r"split the input into smaller partitions \(ddf.repartition"):
        check_memory(limit, 200_000, 768, options, 100_000)
    with pytest.raises(OptionError, match=r"max_chunk_rows=\d+") as caught:  # a pack: fewer rows gathered
        check_memory(limit, 100_000, 768, options, 100_000, packed=True)
    fits = int(re.search(r"max_chunk_rows=(\d+)", str(caught.value)).group(1))
    check_memory(limit, fits, 768, options, fits, packed=True)


def test_default_budget_comes_from_the_workers(client, corpus):
    ddf = dd.from_pandas(corpus, npartitions=2, sort=False)
    worker = next(iter(client.scheduler_info()["workers"].values()))
    limit = worker["memory_limit"] / worker["nthreads"]  # the conftest cluster: 3 GiB, 1 thread
    budget = resolve_budget(None, scheduler=client)
    held = max(rss for _, rss in client.run(_process_memory).values())
    # a thread's share of the worker, or less: what its process leaves below Dask's pause threshold
    # (whole bytes: the budget is rounded down)
    assert int(min(WORKER_SHARE * limit, 0.8 * limit - held)) <= budget <= WORKER_SHARE * limit
    spec = plan_selection(ddf, scheduler=client)[0]
    assert spec.memory_budget is None and budget <= spec.memory_limit <= WORKER_SHARE * limit  # checked only
    spec = plan_selection(ddf, scheduler=client, memory_budget="off")[0]
    assert (spec.memory_limit, spec.memory_budget) == (None, None)
    assert plan_selection(ddf, scheduler="threads")[0].memory_limit is None  # local scheduler: no limit
    spec = plan_selection(ddf, memory_budget="64MiB")[0]
    assert (spec.memory_limit, spec.memory_budget) == (None, 64 * 2**20)


def test_a_binding_budget_gives_the_same_selection_everywhere(client):
    corpus = make_corpus(1200, 128, seed=8)
    ddf = dd.from_pandas(corpus, npartitions=2, sort=False)
    options = {"n_epochs": 10, "n_rollout": 4, "refine_epochs": 5}
    out = datamask_select(ddf, ratio=0.1, memory_budget="1MiB", **options)
    spec = plan_selection(ddf, memory_budget="1MiB", **options)[0]
    assert plan_memory(spec.memory_budget, 600, 128, spec.options, spec.max_chunk_rows).max_chunk_rows < 300
    local = out.compute(scheduler="sync")["selected"].to_numpy()  # 600-row partitions, in chunks
    assert local.sum() == 120
    np.testing.assert_array_equal(out.compute(scheduler=client)["selected"].to_numpy(), local)
    unbounded = datamask_select(ddf, ratio=0.1, memory_budget="off", **options).compute(scheduler="sync")
    generous = datamask_select(ddf, ratio=0.1, memory_budget="1GiB", **options).compute(scheduler="sync")
    np.testing.assert_array_equal(generous["selected"].to_numpy(), unbounded["selected"].to_numpy())
