"""Progress bars for Dask computations: partitions done, on the local schedulers or a distributed client.

``progress=None`` (the default of :func:`datamask_dask.write_selection`) shows a bar only where
someone watches: stderr is a terminal, or the code runs in a Jupyter kernel. ``True`` forces it
(``datamask select --progress``), ``False`` silences it. Bars go to stderr, so stdout stays
the command's result.

- local schedulers (threads, processes, sync): :class:`dask.diagnostics.ProgressBar`;
- a distributed client (given as ``scheduler`` or the current default client):
  :func:`distributed.progress` on the futures (a widget in notebooks, text elsewhere).
"""

from __future__ import annotations

import contextlib
import os
import sys

import dask


def wanted(progress: bool | None) -> bool:
    """Whether to show a bar: ``progress`` if given, else when stderr is a TTY or in a notebook."""
    if progress is not None:
        return bool(progress)
    if os.environ.get("DATAMASK_PROGRESS", "").lower() in ("1", "true", "yes"):
        return True
    try:
        if sys.stderr is not None and sys.stderr.isatty():
            return True
    except (AttributeError, ValueError):
        pass
    return _in_notebook()


def _in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    if shell is None or "ipykernel" not in sys.modules:
        return False
    try:
        return type(shell.get_ipython()).__name__ == "ZMQInteractiveShell"
    except Exception:
        return False


def client_of(scheduler):
    """The distributed Client a computation will run on, or None for the local schedulers."""
    try:
        from distributed import Client, default_client
    except ImportError:
        return None
    if isinstance(scheduler, Client):
        return scheduler
    if scheduler is None and dask.config.get("scheduler", None) in (None, "dask.distributed"):
        with contextlib.suppress(ValueError):
            return default_client()
    return None


def compute(*collections, scheduler=None, progress: bool | None = None):
    """``dask.compute(*collections, scheduler=scheduler)`` with a progress bar when :func:`wanted`."""
    if not wanted(progress):
        return dask.compute(*collections, scheduler=scheduler)
    client = client_of(scheduler)
    if client is None:
        from dask.diagnostics import ProgressBar

        with ProgressBar(out=sys.stderr):
            return dask.compute(*collections, scheduler=scheduler)
    from distributed import progress as distributed_progress

    futures = client.compute(list(collections))
    notebook = _in_notebook()
    with contextlib.redirect_stdout(sys.stderr) if not notebook else contextlib.nullcontext():
        # The scheduler address: the client need not be the default one.
        distributed_progress(futures, notebook=notebook, multi=False, scheduler=client.scheduler.address)
    return tuple(client.gather(futures))
