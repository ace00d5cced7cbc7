"""Seeing a selection: ``build_report(OUTPUT, OUT_DIR)`` writes an HTML page with figures and tables.

Needs matplotlib (``pip install matplotlib``). The command line entry is in :mod:`.cli`
(``datamask report OUTPUT``).
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "build": ["build_report", "pca_2d"],
    "cli": ["add_report_parser", "report_command", "run_report"],
})
