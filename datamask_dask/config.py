"""Settings of a selection job, merged by precedence.

Highest first: keyword arguments > a config (``config=`` / ``--config``: a profile name or a YAML
file) > the ``datamask`` namespace of ``dask.config`` (e.g.
``dask.config.set({"datamask.n_epochs": 50})``, ``DASK_DATAMASK__N_EPOCHS=50`` or a ``datamask:``
section in a Dask YAML file) > the device's profile > the built-in defaults (the fields of
:class:`~datamask_dask.options.SelectOptions` and :class:`~datamask_dask.learn.options.DataMaskOptions`
and, for the metric chosen, :data:`METRIC_DEFAULTS`). :func:`resolve_options` applies them once per run.

Profiles ship inside the package (``datamask_dask/profiles/``; ``conf/`` in the repository links
to them): ``cpu`` applies when the job runs on CPU, ``gpu`` when it runs on a GPU
(``device="cuda"``, or cuDF partitions with ``device="auto"``), and ``reference`` is the published
method with the reference tool's settings. A ``config`` replaces the device's profile; a profile or
file overrides the built-in defaults only (copy a profile to tune it). The resolved options name
what was used in ``profile``.

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

import difflib
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from .errors import WRITING_DOORS, OptionError
from .learn.options import check_value
from .options import ALIASES, FIELDS, SelectOptions, default_settings

#: Defaults that depend on the diversity metric chosen: they win over the defaults of the fields and lose
#: to every profile, config, ``dask.config`` value and keyword argument.
METRIC_DEFAULTS: dict = {
    "Facility": {
        # Chunks capped in values as well as rows: its clustered k-NN graph costs a row about in proportion
        # to the dimension. No larger at a low dimension: a chunk is learned on one core, and regions
        # (plan/regions.py) learn a table of many chunks as well as one chunk would, on every core.
        "max_chunk_rows": 100_000,
        "max_chunk_values": 76_800_000,
        "exact_neighbours": 4096,  # above this the k-NN graph searches the nearest clusters (knn.py)
        "refine_reference": 1_000_000,  # every row of the chunk is represented (a sample fits its noise)
        "refine_epochs": 30,  # its rewards move less per step than Pair_simi's
        "refine_lr": 1.0,
    },
    "DiSF": {"max_chunk_rows": 10_000},  # its step over a chunk's Gram factor grows faster than the chunk
}

PROFILES = Path(__file__).resolve().parent / "profiles"
SECTIONS = "algorithms"  # key of the per-metric sections
# the writing doors' keywords, which differ between them: given to the other door, they are named
WRITING_KEYWORDS = ("overwrite", "mode")


def default_text(key: str) -> str:
    """A setting's built-in default as ``--help`` shows it, with the metrics whose default differs."""
    def shown(value):
        return "none" if value is None else f"{value}"

    differ = [f"{metric}: {shown(values[key])}" for metric, values in METRIC_DEFAULTS.items()
              if key in values]
    return shown(default_settings()[key]) + (f"; {', '.join(differ)}" if differ else "")


def read_config_file(path: str | os.PathLike) -> dict:
    """Read a YAML config file (``yaml.safe_load``), a local path or a URI (``s3://...``), into a mapping
    with canonical keys."""
    # here, not at the top: the command line imports this module before parsing its flags
    import fsspec
    import yaml

    source = f"config file {os.fspath(path)!r}"
    try:
        with fsspec.open(os.fspath(path), "r", encoding="utf-8") as handle:  # a path or any fsspec URI
            data = yaml.safe_load(handle)
    except FileNotFoundError as exc:
        raise OptionError(f"{source} does not exist") from exc
    except IsADirectoryError as exc:
        raise OptionError(f"{source} is a directory: give a YAML file or a profile's name") from exc
    except yaml.YAMLError as exc:  # one line: where, and the parser's problem without its excerpt
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise OptionError(f"{source} is not valid YAML{where}: {problem}") from exc
    except Exception as exc:  # its filesystem's package missing, no credentials, a store out of reach
        raise OptionError(f"{source} could not be read: {type(exc).__name__}: {exc}") from exc
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
        if name in WRITING_KEYWORDS:
            raise OptionError(f"{key!r} is not an option of the selection ({source}): {WRITING_DOORS}")
        if name not in FIELDS:
            close = difflib.get_close_matches(name, [*FIELDS, *ALIASES], n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise OptionError(f"unknown option {key!r} in {source}; {hint}known options are {sorted(FIELDS)} "
                              f"(aliases: {sorted(ALIASES)})")
        if name in out:
            raise OptionError(f"option {name!r} is given twice in {source} (under two spellings)")
        out[name] = value
    return out


def profile_names() -> list[str]:
    """The profiles shipped with the package."""
    return sorted(p.stem for p in PROFILES.glob("*.yaml"))


def profile_path(config: str | os.PathLike) -> Path | str:
    """The file a ``config`` names: a profile (``"cpu"``, ``"gpu"``, ``"reference"``), a path or a URI."""
    text = os.fspath(config)
    if text in profile_names():
        return PROFILES / f"{text}.yaml"
    if "://" in text:
        return text
    path = Path(text)
    if not path.exists() and os.sep not in text and not path.suffix:
        close = difflib.get_close_matches(text, profile_names(), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise OptionError(f"config {text!r} is neither a profile nor a file: {hint}profiles are "
                          f"{profile_names()}, or give the path of a YAML file")
    return path


def resolve_options(config: str | os.PathLike | Mapping | SelectOptions | None = None, /, *,
                    backend: str | None = None, **overrides) -> SelectOptions:
    """Resolve the settings of a selection job, once: the options every engine and run then take.

    Parameters
    ----------
    config : str, path, mapping or SelectOptions, optional
        A profile name (``"cpu"``, ``"gpu"``, ``"reference"``), a YAML config file, or a mapping
        with the same keys. Default: the profile of the device the job runs on. Options already
        resolved are returned as they are (and take no ``overrides``).
    backend : {"pandas", "cudf"}, optional
        The partitions' backend: with ``device="auto"``, cuDF data get the ``gpu`` profile.
    **overrides
        Settings that win over everything else; ``None`` values count as not given.

    Returns
    -------
    SelectOptions
        Every setting, checked; ``profile`` names the profile, the config file's path, or
        ``"mapping"``, and ``given`` the keys of ``overrides``.

    Examples
    --------
    >>> import dask
    >>> with dask.config.set({"datamask.n_epochs": 50}):
    ...     resolve_options(None, lamb=0.3).learner.n_epochs
    50
    """
    import dask

    if isinstance(config, SelectOptions):
        if any(value is not None for value in overrides.values()):
            raise OptionError("options already resolved take no keyword options: use options.replace(...)")
        return config
    settings = default_settings()
    dask_source = "dask.config namespace 'datamask'"
    from_dask = normalise_keys(dask.config.get("datamask", default=None) or {}, dask_source)
    given = normalise_keys({k: v for k, v in overrides.items() if v is not None}, "keyword arguments", False)
    if isinstance(config, Mapping):
        layers = [(from_dask, dask_source), (normalise_keys(config, "config mapping"), "config mapping")]
        profile = "mapping"
    elif config is not None:
        path = profile_path(config)
        layers = [(from_dask, dask_source), (read_config_file(path), f"config file {os.fspath(path)!r}")]
        profile = path.stem if isinstance(path, Path) and path.parent == PROFILES else os.fspath(config)
    else:
        # the device's profile: gpu for CUDA devices, or cuDF data on "auto"
        device = str(given.get("device", from_dask.get("device")) or "auto")
        profile = "gpu" if device.startswith("cuda") or (device == "auto" and backend == "cudf") else "cpu"
        layers = [(read_config_file(PROFILES / f"{profile}.yaml"), f"profile {profile!r}"),
                  (from_dask, dask_source)]
    # the metric the job runs (the last layer naming one wins): its built-in defaults and sections apply
    algorithm = given.get("algorithm", next((layer["algorithm"] for layer, _ in reversed(layers)
                                             if "algorithm" in layer), settings["algorithm"]))
    chosen = _metric_key(algorithm) if isinstance(algorithm, str) else None  # a weights mapping: none
    defaults = {_metric_key(name, strict=True): values for name, values in METRIC_DEFAULTS.items()}
    settings.update(defaults.get(chosen, {}))
    sections: dict = {}
    where: dict = {}  # the layer each setting that is not a keyword came from, to say so if it is refused
    section_where: dict = {}
    for layer, source in layers:
        for metric, section in layer.pop(SECTIONS, {}).items():
            key = _metric_key(metric, strict=True)
            sections.setdefault(key, {}).update(section)
            section_where.setdefault(key, {}).update(
                dict.fromkeys(section, f"{source}, section {SECTIONS}.{metric}"))
        settings.update(layer)
        where.update(dict.fromkeys(layer, source))
    settings.update(sections.get(chosen, {}))
    where.update(section_where.get(chosen, {}))
    settings.update(given)
    for name, source in where.items():
        if name not in given:
            try:
                check_value(FIELDS[name], settings[name])
            except OptionError as exc:  # on the command line the flag's name alone would mislead
                raise OptionError(f"{exc} (set as {name}: in {source})") from exc
    if profile == "gpu" and backend == "pandas" and not str(settings["device"]).startswith("cuda"):
        # its chunks are sized for a GPU's learner; on the CPU they take far longer than the cpu profile's
        logging.getLogger(__name__).warning(
            "profile 'gpu' on pandas partitions, which device=%r learns on the CPU: its chunks of up to %s "
            "rows are sized for a GPU; use the cpu profile (config='cpu', --config cpu), or device='cuda' "
            "(--device cuda) where the workers have GPUs",
            settings["device"], settings["max_chunk_rows"])
    return SelectOptions.from_settings(settings, profile=profile, given=given)


def load_config(config: str | os.PathLike | Mapping | None = None, /, *, backend: str | None = None,
                **overrides) -> dict:
    """The settings :func:`resolve_options` gives, as one flat mapping with ``"profile"``
    (:meth:`SelectOptions.to_dict`)."""
    return resolve_options(config, backend=backend, **overrides).to_dict()


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
