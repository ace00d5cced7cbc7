"""``get_client``: a distributed Client on a local CPU cluster, a local GPU cluster or a scheduler.

dask-cuda (and rmm) are imported only for ``kind="cuda"``, so CPU machines never need them.
Workers get ``threads_per_worker`` threads for BLAS/OpenMP and torch, so ``n_workers *
threads_per_worker`` threads share the cores instead of every worker grabbing all of them.
"""

from __future__ import annotations

import gc
import inspect
import multiprocessing
import os
import signal
import socket
import threading

import dask
from distributed import Client, WorkerPlugin

_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
# Dask's nanny sets MALLOC_TRIM_THRESHOLD_ for its workers, which also pins glibc's mmap threshold
# at 128 KiB: every larger array (the learner's step tensors) is then mmapped and page-faulted
# afresh on each use. Blocks up to 32 MiB (glibc's maximum) come from the heap and are reused.
_MALLOC_VARIABLES = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20)}


class WorkerSetup(WorkerPlugin):
    """Worker plugin: cap torch's and Arrow's CPU threads (BLAS threads follow the spawn environment),
    and import the selection code while the cluster starts rather than in the first task (pandas,
    dask.dataframe and torch: seconds on a fresh worker, on the critical path of every job).
    """

    name = "datamask-worker-setup"

    def __init__(self, n_threads: int):
        self.n_threads = int(n_threads)

    def setup(self, worker) -> None:
        import dask.dataframe  # noqa: F401  (with dask.array, fsspec, scipy...: ~1 s, 300 modules)
        import pyarrow
        import torch

        from .io import parquet, sinks  # noqa: F401  (the modules a selection task runs)
        from .run import protocol  # noqa: F401

        torch.set_num_threads(self.n_threads)
        pyarrow.set_cpu_count(self.n_threads)  # parquet decoding: workers must not share cores
        if threading.current_thread() is threading.main_thread():
            # a terminal's Ctrl-C reaches the whole process group: the client stops the workers
            signal.signal(signal.SIGINT, signal.SIG_IGN)


_MAIN_GUARD = ("the local cluster's worker processes could not start: when get_client() runs in a script, "
               "call it under `if __name__ == \"__main__\":`, since worker processes start by importing the "
               "script again and must not start a cluster of their own")


class SchedulerUnreachable(OSError):
    """No Dask scheduler can be at ``address``: ``reason`` says why."""

    def __init__(self, address: str, reason: str):
        super().__init__(f"no Dask scheduler at {address}: {reason}")
        self.address, self.reason = address, reason


def _probe_scheduler(address: str) -> None:
    """Fail at once where no scheduler can be at a TCP ``address`` (nothing listens, no such host), rather
    than after Dask's connect timeout of retries; anything else is left to the Client's connect."""
    scheme, _, rest = address.rpartition("://")
    host, _, port = rest.rpartition(":")
    if scheme not in ("", "tcp"):
        return
    if not port.isdigit():
        raise SchedulerUnreachable(address, "an address is host:port, as a scheduler prints it ('Scheduler "
                                   "at: tcp://10.0.0.5:8786')")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except ConnectionRefusedError:
        raise SchedulerUnreachable(address, "nothing listens there (connection refused); check the address a "
                                   "scheduler prints as 'Scheduler at: tcp://...'") from None
    except socket.gaierror as exc:
        raise SchedulerUnreachable(address, f"the host {host} is not known ({exc.strerror})") from None
    except OSError:  # a timeout or an unreachable network: the Client's own connect says it
        pass


def get_client(kind: str = "cpu", n_workers: int | None = None, threads_per_worker: int = 1,
               memory_limit: str | int | float | None = "auto", set_as_default: bool = True,
               **cluster_kwargs) -> Client:
    """A distributed Client for a selection job.

    Parameters
    ----------
    kind : str
        ``"cpu"``: a ``LocalCluster`` of worker processes. ``"cuda"``: a ``LocalCUDACluster``
        (dask-cuda), one worker per visible GPU, with an rmm pool shared with torch when rmm is
        installed. Anything else is taken as the address of a running scheduler
        (``"tcp://host:8786"``); the other arguments are then ignored.
    n_workers : int, optional
        Workers to start: by default as many as the cores allow at ``threads_per_worker`` each
        (``"cpu"``), or one per GPU (``"cuda"``).
    threads_per_worker : int
        Threads of each worker, also used for its BLAS/OpenMP and torch threads.
    memory_limit : str, int or float, optional
        Memory limit per worker, as Dask accepts it (``"4GiB"``...). ``"auto"`` (``"cpu"``): the
        machine's memory shared evenly by the workers started (Dask's own ``"auto"`` gives a worker
        its threads' share of the cores, which leaves memory idle when the workers are fewer).
    set_as_default : bool
        Make the client Dask's default scheduler (``compute()`` then runs on it).
    **cluster_kwargs
        Passed to ``LocalCluster`` / ``LocalCUDACluster`` (e.g. ``dashboard_address=":0"``,
        ``rmm_pool_size="20GB"``).

    Returns
    -------
    distributed.Client
        ``client.shutdown()`` stops a cluster started here (``client.close()`` also does for
        ``"cpu"``, but only disconnects for ``"cuda"``).
    """
    if kind not in ("cpu", "cuda"):
        _probe_scheduler(kind)
        return Client(kind, set_as_default=set_as_default)
    # A spawned worker re-imports the script before multiprocessing knows its parent: it is then
    # still "inheriting" (what multiprocessing's own check of this mistake reads).
    if multiprocessing.parent_process() is not None or getattr(multiprocessing.current_process(),
                                                               "_inheriting", False):
        raise RuntimeError(_MAIN_GUARD + " (this process is a worker that re-imported the script)")
    threads_per_worker = int(threads_per_worker)
    if threads_per_worker < 1:
        raise ValueError(f"threads_per_worker={threads_per_worker} must be >= 1")
    if n_workers is not None and int(n_workers) < 1:  # a cluster of no workers would leave a job waiting
        raise ValueError(f"n_workers={n_workers} must be >= 1 (None: as many as the cores allow)")
    # BLAS and OpenMP read these when they load, so they must be set before the worker spawns;
    # they also go to the Nanny's env, which wins over whatever the parent process has set.
    environ = {name: str(threads_per_worker) for name in _THREAD_VARIABLES}
    cluster_kwargs = {**cluster_kwargs, "env": {**environ, **cluster_kwargs.get("env", {})}}
    # The workers' statistical profiler samples the running task every 10 ms: it slows numeric tasks.
    configured = dask.config.get("distributed.nanny.pre-spawn-environ", default={})
    spawn_environ = {**_MALLOC_VARIABLES, **configured, **environ}
    unguarded = ""
    with dask.config.set({"distributed.nanny.pre-spawn-environ": spawn_environ,
                          "distributed.worker.profile.enabled": False}):
        try:
            if kind == "cpu":
                if n_workers is None:
                    n_workers = max(1, (os.cpu_count() or 1) // threads_per_worker)
                if memory_limit == "auto":
                    from distributed.system import MEMORY_LIMIT  # the machine's memory, or its cgroup's

                    memory_limit = MEMORY_LIMIT // n_workers
                client = Client(n_workers=n_workers, threads_per_worker=threads_per_worker, processes=True,
                                memory_limit=memory_limit, set_as_default=set_as_default, **cluster_kwargs)
            else:
                client = Client(_cuda_cluster(n_workers, threads_per_worker, memory_limit, cluster_kwargs),
                                set_as_default=set_as_default)
        except RuntimeError as exc:
            import __main__

            if not (getattr(__main__, "__file__", None) and "failed to start" in str(exc)):
                raise
            unguarded = f"{_MAIN_GUARD} ({exc})"
    if unguarded:
        # Dask's half-started Client is collected now, while its event loop runs: collected at exit,
        # its close would wait a minute on the stopped loop (so the error is not chained to it either).
        gc.collect()
        raise RuntimeError(unguarded)
    client.register_plugin(WorkerSetup(threads_per_worker))
    return client


def _cuda_cluster(n_workers, threads_per_worker, memory_limit, cluster_kwargs):
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError as exc:
        raise ImportError("get_client('cuda') needs dask-cuda: pip install 'datamask-dask[gpu-cu12]' "
                          "(or [gpu-cu13] for CUDA 13)") from exc
    kwargs = dict(cluster_kwargs)
    try:
        import rmm  # noqa: F401

        # One rmm pool per GPU, used by cuDF and, where dask-cuda can set it up, by torch too.
        kwargs.setdefault("rmm_pool_size", 0.5)  # a fraction of each GPU's memory
        if "rmm_allocator_external_lib_list" in inspect.signature(LocalCUDACluster).parameters:
            kwargs.setdefault("rmm_allocator_external_lib_list", ["torch", "cupy"])
    except ImportError:
        pass
    return LocalCUDACluster(n_workers=n_workers, threads_per_worker=threads_per_worker,
                            memory_limit=memory_limit, **kwargs)
