"""numba kernels compiled on a process's first use, once however many threads ask.

numba (and LLVM, about 0.1 GiB a process) is imported only by the run that needs a kernel. A threaded
scheduler's tasks may ask at the same moment, and a compile that rebinds a module's name to its
compiled helper must not run twice.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")


def on_first_use(factory: Callable[[], _T]) -> Callable[[], _T]:
    """``factory``'s value (its compiled kernels), made on the first call and kept: :func:`functools.cache`
    behind a lock."""
    cached = functools.cache(factory)
    lock = threading.Lock()

    @functools.wraps(factory)
    def value() -> _T:
        with lock:
            return cached()

    return value
