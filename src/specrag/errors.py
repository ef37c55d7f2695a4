"""User-facing errors: each carries one line that the CLI prints without a traceback."""


class SpecRagError(Exception):
    """An error whose message is meant for the user as-is (one line, actionable)."""


class ModelLoadError(SpecRagError):
    """A model could not be found or loaded."""


class IndexError_(SpecRagError):
    """The vector index is missing, unreadable or inconsistent."""


class InputError(SpecRagError):
    """The user's question, document or configuration is not acceptable."""


class DataDirError(SpecRagError):
    """The data dir, or a file specrag keeps there (thread checkpoints), cannot be used."""
