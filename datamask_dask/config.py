"""Settings of a selection job, merged by precedence.

Highest first: keyword arguments > a config (``config=`` / ``--config``: a profile name or a YAML
file) > the ``datamask`` namespace of ``dask.config`` (e.g.
``dask.config.set({"datamask.n_epochs": 50})``, ``DASK_DATAMASK__N_EPOCHS=50`` or a ``datamask:``
section in a Dask YAML file) > the device's profile > the built-in defaults (:class:`OperatorOptions`,
:class:`~datamask_dask.learn.options.DataMaskOptions` and, for the metric chosen,
:data:`METRIC_DEFAULTS`).

Profiles ship inside the package (``datamask_dask/profiles/``; ``conf/`` in the repository links
to them): ``cpu`` applies when the job runs on CPU, ``gpu`` when it runs on a GPU
(``device="cuda"``, or cuDF partitions with ``device="auto"``), and ``reference`` is the published
method with the reference tool's settings. A ``config`` replaces the device's profile; a profile or
file overrides the built-in defaults only (copy a profile to tune it). The resolved settings name
what was used under ``"profile"``.

A config file is a flat YAML mapping (optionally under a top-level ``datamask:`` key) of the
learner options and the operator settings, read with ``yaml.safe_load`` only; unknown keys raise
:class:`OptionError`. Under ``algorithms:``, a section per metric name holds settings that apply
only when that metric is the one chosen (by the profile or by a keyword argument); they win over
the profile's other keys and lose to keyword arguments::

    algorithm: Pair_simi
    refine_epochs: 5
    algorithms:
      Facility: {refine_epochs: 50, max_chunk_rows: 20000}
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import os
from collections.abc import Mapping
from pathlib import Path

from .errors import OptionError
from .learn.options import RULES as LEARNER_RULES
from .learn.options import DataMaskOptions, check_option


@dataclasses.dataclass(frozen=True)
class OperatorOptions:
    """The operator's settings and their defaults (the learner's are :class:`DataMaskOptions`')."""

    ratio: float | dict = 0.1  # share of rows to select, in (0, 1]; or {group: ratio} with `by`
    budget_tokens: int | dict | None = None  # select by tokens: total tokens of the selected rows <= this
    token_column: str = "n_tokens"  # noqa: S105 (a column name, not a secret)
    by: str | None = None  # group column: quotas per group
    id_column: str = "chunk_id"
    quality_column: str | list | dict = "quality_score"  # a name, a list of names, or {name: weight}
    embedding_column: str = "feature_arr"
    selected_column: str = "selected"
    score_column: str | None = None  # also output the learned logits under this name
    device: str = "auto"  # "auto" (GPU for cuDF partitions), "cpu", "cuda", "cuda:N"
    # Rows are learned in chunks of at most this many (consecutive partitions packed into one in
    # table scope), which select apart: a larger chunk sees more of its rows' neighbours.
    max_chunk_rows: int | None = 50_000
    # Where max_chunk_rows is None: a chunk holds at most this many embedding values (rows x dimension).
    max_chunk_values: int | None = None
    oversample: float = 2.0  # candidate pool = table-wide quality top (oversample * quota) rows
    check_ids: bool = True  # fail on duplicate ids (needs every id in one task: turn off for huge tables)
    # "light": the plan pass reads the small columns only, and embeddings are checked chunk by chunk
    # just before learning (one read of the embeddings fewer); "full": the plan pass checks them too.
    validate: str = "light"
    memory_budget: int | str | None = None  # bytes (or "2GiB") per selection task: sizes chunks
    diversity_scope: str = "table"  # "table": near-duplicates across partitions first; "partition": none
    duplicate_cosine: float = 0.95  # near-duplicate threshold of the table scope
    explain: bool = False  # also output each row's reason (selected, near-duplicate...) and duplicate_of


#: Operator settings and their defaults.
OPERATOR_DEFAULTS: dict = {f.name: f.default for f in dataclasses.fields(OperatorOptions)}

#: Defaults that depend on the diversity metric chosen: they win over the defaults above and lose
#: to every profile, config, ``dask.config`` value and keyword argument.
METRIC_DEFAULTS: dict = {
    "Facility": {
        # Chunks sized in values: its clustered k-NN graph costs a row about in proportion to the
        # dimension, so low-dimensional tables learn larger chunks (100,000 rows at d = 768) in the same time.
        "max_chunk_rows": None,
        "max_chunk_values": 76_800_000,
        "exact_neighbours": 4096,  # above this the k-NN graph searches the nearest clusters (knn.py)
        "refine_reference": 1_000_000,  # every row of the chunk is represented (a sample fits its noise)
        "refine_epochs": 30,  # its rewards move less per step than Pair_simi's
        "refine_lr": 1.0,
    },
    "DiSF": {"max_chunk_rows": 10_000},  # its step over a chunk's Gram factor grows faster than the chunk
}

#: Other spellings accepted for a key (the reference tool's and the issue's).
ALIASES = {"select_ratio": "ratio", "quality": "quality_column", "embedding": "embedding_column",
           "id": "id_column"}

PROFILES = Path(__file__).resolve().parent / "profiles"

LEARNER_KEYS = tuple(f.name for f in dataclasses.fields(DataMaskOptions) if f.init)  # not the derived ones
SECTIONS = "algorithms"  # key of the per-metric sections


def default_settings() -> dict:
    """The defaults: learner options from DataMaskOptions, then the operator's.

    Read from the fields, not an instance: validating one resolves the metrics, which loads torch,
    and ``--help`` shows these defaults."""
    return {**{name: getattr(DataMaskOptions, name) for name in LEARNER_KEYS}, **OPERATOR_DEFAULTS}


def default_text(key: str) -> str:
    """A setting's built-in default as ``--help`` shows it, with the metrics whose default differs."""
    def shown(value):
        return "none" if value is None else f"{value}"

    differ = [f"{metric}: {shown(values[key])}" for metric, values in METRIC_DEFAULTS.items()
              if key in values]
    return shown(default_settings()[key]) + (f"; {', '.join(differ)}" if differ else "")


def read_config_file(path: str | os.PathLike) -> dict:
    """Read a YAML config file (``yaml.safe_load``) into a mapping with canonical keys."""
    import yaml  # here, not at the top: the command line imports this module before parsing its flags

    source = f"config file {os.fspath(path)!r}"
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except FileNotFoundError as exc:
        raise OptionError(f"{source} does not exist") from exc
    except yaml.YAMLError as exc:
        raise OptionError(f"{source} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if isinstance(data, Mapping) and set(data) == {"datamask"}:
        data = data["datamask"]
    if not isinstance(data, Mapping):
        raise OptionError(f"{source} must hold a mapping of option: value")
    return normalise_keys(data, source)


def normalise_keys(values: Mapping, source: str, sections: bool = True) -> dict:
    """Canonical keys (hyphens to underscores, aliases resolved); unknown keys raise OptionError.

    With ``sections``, an ``algorithms`` mapping of per-metric sections is accepted too (each
    normalised the same way, without sections of its own or an ``algorithm`` key).
    """
    out: dict = {}
    for key, value in values.items():
        name = str(key).replace("-", "_")
        name = ALIASES.get(name, name)
        if name == SECTIONS and sections:
            if not isinstance(value, Mapping) or not all(isinstance(v, Mapping) for v in value.values()):
                raise OptionError(f"{SECTIONS!r} in {source} must map metric names to mappings of settings")
            out[name] = {str(metric): normalise_keys(section, f"{source}, section {SECTIONS}.{metric}", False)
                         for metric, section in value.items()}
            if any("algorithm" in section for section in out[name].values()):
                raise OptionError(f"a section under {SECTIONS!r} in {source} cannot set 'algorithm'")
            continue
        if name not in OPERATOR_DEFAULTS and name not in LEARNER_KEYS:
            known = sorted({*LEARNER_KEYS, *OPERATOR_DEFAULTS})
            raise OptionError(f"unknown option {key!r} in {source}; known options are {known} "
                              f"(aliases: {sorted(ALIASES)})")
        if name in out:
            raise OptionError(f"option {name!r} is given twice in {source} (under two spellings)")
        out[name] = value
    return out


def profile_names() -> list[str]:
    """The profiles shipped with the package."""
    return sorted(p.stem for p in PROFILES.glob("*.yaml"))


def profile_path(config: str | os.PathLike) -> Path:
    """The file a ``config`` names: a profile (``"cpu"``, ``"gpu"``, ``"reference"``) or a path."""
    text = os.fspath(config)
    if text in profile_names():
        return PROFILES / f"{text}.yaml"
    path = Path(text)
    if not path.exists() and os.sep not in text and not path.suffix:
        close = difflib.get_close_matches(text, profile_names(), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise OptionError(f"config {text!r} is neither a profile nor a file: {hint}profiles are "
                          f"{profile_names()}, or give the path of a YAML file")
    return path


def load_config(config: str | os.PathLike | Mapping | None = None, /, *, backend: str | None = None,
                **overrides) -> dict:
    """Resolve the settings of a selection job.

    Parameters
    ----------
    config : str, path or mapping, optional
        A profile name (``"cpu"``, ``"gpu"``, ``"reference"``), a YAML config file, or a mapping
        with the same keys. Default: the profile of the device the job runs on.
    backend : {"pandas", "cudf"}, optional
        The partitions' backend: with ``device="auto"``, cuDF data get the ``gpu`` profile.
    **overrides
        Settings that win over everything else; ``None`` values count as not given.

    Returns
    -------
    dict
        Every setting (learner options and operator settings), with canonical names, and
        ``"profile"``: the profile name, the config file's path, or ``"mapping"``.

    Examples
    --------
    >>> import dask
    >>> with dask.config.set({"datamask.n_epochs": 50}):
    ...     load_config(None, lamb=0.3)["n_epochs"]
    50
    """
    import dask

    settings = default_settings()
    from_dask = normalise_keys(dask.config.get("datamask", default=None) or {},
                               "dask.config namespace 'datamask'")
    given = normalise_keys({k: v for k, v in overrides.items() if v is not None}, "keyword arguments", False)
    if isinstance(config, Mapping):
        layers, profile = [from_dask, normalise_keys(config, "config mapping")], "mapping"
    elif config is not None:
        path = profile_path(config)
        layers = [from_dask, read_config_file(path)]
        profile = os.fspath(config) if path.parent != PROFILES else path.stem
    else:
        # the device's profile: gpu for CUDA devices, or cuDF data on "auto"
        device = str(given.get("device", from_dask.get("device")) or "auto")
        profile = "gpu" if device.startswith("cuda") or (device == "auto" and backend == "cudf") else "cpu"
        layers = [read_config_file(PROFILES / f"{profile}.yaml"), from_dask]
    # the metric the job runs (the last layer naming one wins): its built-in defaults and sections apply
    algorithm = given.get("algorithm", next((layer["algorithm"] for layer in reversed(layers)
                                             if "algorithm" in layer), settings["algorithm"]))
    chosen = _metric_key(algorithm) if isinstance(algorithm, str) else None  # a weights mapping: none
    defaults = {_metric_key(name, strict=True): values for name, values in METRIC_DEFAULTS.items()}
    settings.update(defaults.get(chosen, {}))
    sections: dict = {}
    for layer in layers:
        for metric, section in layer.pop(SECTIONS, {}).items():
            sections.setdefault(_metric_key(metric, strict=True), {}).update(section)
        settings.update(layer)
    settings.update(sections.get(chosen, {}))
    settings.update(given)
    settings["profile"] = profile
    return settings


def _metric_key(name: str, strict: bool = False):
    """One key per metric whatever the spelling ("Facility", "fl"...).

    Unknown names raise with ``strict`` (a section for a misspelt metric would never apply);
    otherwise they stay as they are (the learner's options report them).
    """
    from .learn.metrics import registered_metric

    try:
        return registered_metric(name)
    except OptionError as exc:
        if strict:
            raise OptionError(f"section {SECTIONS}.{name}: {exc}") from exc
        return name


def learner_options(settings: Mapping) -> DataMaskOptions:
    """The learner's options from resolved settings (validated by DataMaskOptions)."""
    return DataMaskOptions.from_mapping({k: settings[k] for k in LEARNER_KEYS if k in settings})


# Rules on single values of the operator's settings: partition.spec applies them to resolved settings,
# and the command line to its flags before it reads anything or loads a dataframe library.


def is_number(value) -> bool:
    """A real number, Python's or numpy's, and not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _finite(value) -> bool:
    return isinstance(value, numbers.Integral) or math.isfinite(value)


def check_ratio(ratio, by) -> None:
    """``ratio``: a share of rows in (0, 1], or ``{group: share in [0, 1]}`` with ``by``."""
    if isinstance(ratio, Mapping):
        if by is None:
            raise OptionError("ratio given as {group: ratio} needs by= (the group column)")
        for group, value in ratio.items():
            if not is_number(value) or not 0 <= value <= 1:
                raise OptionError(f"ratio for group {group!r} is {value!r}: expected a share in [0, 1]")
    elif not is_number(ratio) or not 0 < ratio <= 1:
        raise OptionError(f"ratio={ratio!r} is out of range: expected a share of rows in (0, 1], e.g. 0.1")


def check_budget_tokens(budget, by) -> None:
    """``budget_tokens``: a whole number of tokens >= 1, or ``{group: tokens >= 0}`` with ``by``."""
    if isinstance(budget, Mapping):
        if by is None:
            raise OptionError("budget_tokens given as {group: tokens} needs by= (the group column)")
        for group, value in budget.items():
            if not is_number(value) or not _finite(value) or value < 0 or value != int(value):
                raise OptionError(f"budget_tokens for group {group!r} is {value!r}: expected a whole "
                                  "number of tokens >= 0")
        return
    if by is not None:
        raise OptionError("with by=, give budget_tokens as {group: tokens} (a single budget would not say "
                          "how to share it between groups)")
    if not is_number(budget) or not _finite(budget) or budget < 1 or budget != int(budget):
        raise OptionError(f"budget_tokens={budget!r} is invalid: expected a whole number of tokens >= 1")


def check_number(value, name: str, minimum: float, integer: bool = False):
    """``value`` where it is a finite number (an integer with ``integer``) >= ``minimum``."""
    if (not is_number(value) or not _finite(value) or value < minimum
            or (integer and value != int(value))):
        kind = "an integer" if integer else "a number"
        raise OptionError(f"option {name}={value!r} is invalid: expected {kind} >= {minimum}")
    return value


def check_duplicate_cosine(cosine) -> None:
    """``duplicate_cosine``: a cosine in (0, 1)."""
    if not is_number(cosine) or not 0 < cosine < 1:
        raise OptionError(f"option duplicate_cosine={cosine!r} is invalid: expected a cosine in (0, 1), "
                          "e.g. 0.95")


def check_given(options: Mapping) -> None:
    """Apply the rules on single values to the settings given as ``options`` (keyword arguments, which win
    over every other layer), so they are refused before a config or any data is read. The ratio and token
    budget mappings, which need ``by`` from every layer, are left to the resolved settings."""
    for name, value in options.items():
        if value is None:
            continue
        if name in LEARNER_RULES:
            check_option(name, value)
        elif name == "ratio" and not isinstance(value, Mapping):
            check_ratio(value, None)
        elif name == "budget_tokens" and not isinstance(value, Mapping):
            check_budget_tokens(value, options.get("by"))
        elif name in ("max_chunk_rows", "max_chunk_values"):
            check_number(value, name, 2, integer=True)
        elif name == "duplicate_cosine":
            check_duplicate_cosine(value)
