"""The project's own exceptions: every bad input ends here, with a message that says what to do."""


class DataMaskError(ValueError):
    """Base class of every error datamask-dask raises on bad input or options."""


class OptionError(DataMaskError):
    """An option is out of range or unknown (the message names the option)."""


class InputDataError(DataMaskError):
    """The input data breaks the data contract (the message names the column, partition and rows)."""
