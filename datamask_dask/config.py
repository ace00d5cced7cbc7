"""Settings of a selection job, merged from four places.

Precedence, highest first: keyword arguments > a YAML config file (``config=`` / ``--config``) >
the ``datamask`` namespace of ``dask.config`` (e.g. ``dask.config.set({"datamask.n_epochs": 50})``,
``DASK_DATAMASK__N_EPOCHS=50`` or a ``datamask:`` section in a Dask YAML file) > the defaults.

A config file is a flat YAML mapping (optionally nested under a top-level ``datamask:`` key) of
the learner options (:class:`~datamask_dask.options.DataMaskOptions`) and the operator settings
below. Files are read with ``yaml.safe_load`` only; unknown keys raise :class:`OptionError`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

import dask
import yaml

from .errors import OptionError
from .options import DataMaskOptions

#: Operator settings and their defaults (the learner's come from DataMaskOptions).
OPERATOR_DEFAULTS: dict = {
    "ratio": 0.1,  # share of rows to select, in (0, 1]; or {group: ratio} with `by`
    "budget_tokens": None,  # select by tokens instead: total tokens of the selected rows <= this
    "token_column": "n_tokens",
    "by": None,  # group column: quotas per group
    "id_column": "chunk_id",
    "quality_column": "quality_score",  # a name, a list of names, or {name: weight}
    "embedding_column": "feature_arr",
    "selected_column": "selected",
    "score_column": None,  # also output the learned logits under this name
    "device": "auto",  # "auto" (GPU for cuDF partitions), "cpu", "cuda", "cuda:N"
    "max_chunk_rows": 200_000,  # larger partitions are learned in chunks of at most this many rows
    "oversample": 2.0,  # candidate pool = table-wide quality top (oversample * quota) rows
    "check_ids": True,  # fail on duplicate ids (needs every id in one task: turn off for huge tables)
    "validate": "full",  # "full": the plan pass checks every embedding too; "light": small columns only
    "memory_budget": None,  # bytes (or "2GiB") per selection task; None: from the workers' limits
}

#: Other spellings accepted for a key (the reference tool's and the issue's).
ALIASES = {"select_ratio": "ratio", "quality": "quality_column", "embedding": "embedding_column",
           "id": "id_column"}

LEARNER_KEYS = tuple(f.name for f in dataclasses.fields(DataMaskOptions) if f.name != "metric_weights")


def known_keys() -> list[str]:
    """Every key a config may set."""
    return sorted({*LEARNER_KEYS, *OPERATOR_DEFAULTS})


def default_settings() -> dict:
    """The defaults: learner options from DataMaskOptions, then the operator's."""
    return {**DataMaskOptions().as_dict(), **OPERATOR_DEFAULTS}


def read_config_file(path: str | os.PathLike) -> dict:
    """Read a YAML config file (``yaml.safe_load``) into a mapping with canonical keys."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except FileNotFoundError as exc:
        raise OptionError(f"config file {os.fspath(path)!r} does not exist") from exc
    except yaml.YAMLError as exc:
        raise OptionError(f"config file {os.fspath(path)!r} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if isinstance(data, Mapping) and set(data) == {"datamask"}:
        data = data["datamask"]
    if not isinstance(data, Mapping):
        raise OptionError(f"config file {os.fspath(path)!r} must hold a mapping of option: value")
    return normalise_keys(data, f"config file {os.fspath(path)!r}")


def normalise_keys(values: Mapping, source: str) -> dict:
    """Canonical keys (hyphens to underscores, aliases resolved); unknown keys raise OptionError."""
    out: dict = {}
    for key, value in values.items():
        name = str(key).replace("-", "_")
        name = ALIASES.get(name, name)
        if name not in OPERATOR_DEFAULTS and name not in LEARNER_KEYS:
            raise OptionError(f"unknown option {key!r} in {source}; known options are {known_keys()} "
                              f"(aliases: {sorted(ALIASES)})")
        if name in out:
            raise OptionError(f"option {name!r} is given twice in {source} (under two spellings)")
        out[name] = value
    return out


def load_config(config: str | os.PathLike | Mapping | None = None, /, **overrides) -> dict:
    """Resolve the settings of a selection job.

    Parameters
    ----------
    config : path or mapping, optional
        A YAML config file, or a mapping with the same keys.
    **overrides
        Settings that win over everything else; ``None`` values count as not given.

    Returns
    -------
    dict
        Every setting (learner options and operator settings), with canonical names.

    Examples
    --------
    >>> import dask
    >>> with dask.config.set({"datamask.n_epochs": 50}):
    ...     load_config(None, lamb=0.3)["n_epochs"]
    50
    """
    settings = default_settings()
    settings.update(normalise_keys(dask.config.get("datamask", default=None) or {},
                                   "dask.config namespace 'datamask'"))
    if isinstance(config, Mapping):
        settings.update(normalise_keys(config, "config mapping"))
    elif config is not None:
        settings.update(read_config_file(config))
    given = {k: v for k, v in overrides.items() if v is not None}
    settings.update(normalise_keys(given, "keyword arguments"))
    return settings


def learner_options(settings: Mapping) -> DataMaskOptions:
    """The learner's options from resolved settings (validated by DataMaskOptions)."""
    return DataMaskOptions.from_mapping({k: settings[k] for k in LEARNER_KEYS if k in settings})
