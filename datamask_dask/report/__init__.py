"""Seeing a selection: ``build_report(OUTPUT, OUT_DIR)`` writes an HTML page with figures and tables.

Needs matplotlib (``pip install matplotlib``). The command line entry is in :mod:`.cli`
(``datamask report OUTPUT``).
"""

from .._lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {
    "build": ["build_report", "pca_2d"],
    "cli": ["add_report_parser", "report_command", "run_report"],
})
