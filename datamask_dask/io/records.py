"""One JSON form for what a run writes: manifests, markers, run records and table commit metadata.

Settings and plans hold more than plain data (metric objects, numpy scalars, dataclasses):
:func:`plain` gives each a stable JSON form, so a record hashes and compares the same in every
process and a resumed run reads back exactly what the first one wrote.
"""

from __future__ import annotations

import dataclasses
import json


def plain(value):
    """JSON form of a value ``json`` does not know (the ``default`` hook of :func:`dumps`)."""
    if hasattr(value, "item"):
        return value.item()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"type": type(value).__qualname__, **dataclasses.asdict(value)}
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return {"type": f"{type(value).__module__}.{type(value).__qualname__}",
            "state": {k: v for k, v in sorted(vars(value).items())} if hasattr(value, "__dict__") else None}


def dumps(value, *, indent: int | None = None) -> str:
    """``value`` as JSON text, keys sorted."""
    return json.dumps(value, indent=indent, sort_keys=True, default=plain)


def as_json(value):
    """``value`` as plain data, exactly as a reader of its JSON text gets it back."""
    return json.loads(dumps(value))


def loads_record(text: str | None):
    """The run record in a table commit's metadata ``text``, or None (no text, or not JSON)."""
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None
