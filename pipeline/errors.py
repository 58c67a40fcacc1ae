"""User-facing errors: one clear paragraph, a non-zero exit, no traceback."""


class PipelineError(Exception):
    """An error the user can fix (bad config, bad data, a locked run folder...).

    The CLI prints the message without a traceback (``--debug`` shows it) and
    exits with ``exit_code``.
    """

    exit_code = 1


class ConfigError(PipelineError):
    """The config (file, ``extends`` chain, overrides or values) is invalid."""

    exit_code = 2


class DataError(PipelineError):
    """The dataset cannot be used as configured."""


class ModelError(PipelineError):
    """A model folder or model setting cannot be used."""


class LockedError(PipelineError):
    """Another pipeline holds the run folder."""


class TrainingError(PipelineError):
    """Training stopped on a non-finite loss or similar."""


class CacheError(PipelineError):
    """The teacher cache is missing, corrupted or too large."""
