"""datamask-dask: DATAMASK data selection (quality + diversity, policy-gradient mask learning)
for Dask dataframes, pandas or cuDF partitions, on CPU or GPU.

    out = ddf.pipe(datamask_select, ratio=0.1)   # lazy; adds a boolean `selected` column
"""

from .cluster import get_client
from .config import load_config
from .dask_select import datamask_select
from .engine import MaskResult, learn_mask
from .errors import DataMaskError, InputDataError, OptionError
from .objectives import DiversityMetric, evaluate_selection, register_metric
from .options import DataMaskOptions
from .resume import ResumeError, SelectionReport, write_selection
from .validate import ValidationReport, validate_table

__all__ = [
    "DataMaskError", "DataMaskOptions", "DiversityMetric", "InputDataError", "MaskResult",
    "OptionError", "datamask_select", "evaluate_selection", "get_client", "learn_mask",
    "load_config", "register_metric",
    "ResumeError", "SelectionReport", "ValidationReport", "validate_table", "write_selection",
]
__version__ = "0.1.0"
from .baselines import *  # noqa: F403  (random, top-k and greedy baselines: see baselines.__all__)
