"""One error type per kind of user mistake. Each message names the file/line/field or the flag, the
value received and what to do; the entry-point boundary (tunesmith/cli.py) prints it without a
traceback and exits with status 2. Anything else that escapes is a bug in tunesmith or a library,
and keeps its traceback."""

from __future__ import annotations


class UserError(Exception):
    """Something the user can fix: bad data, a bad flag or config, a missing path, a template that
    cannot render the data."""

    kind = "error"


class ConfigError(UserError, ValueError):
    """A flag, run-config key or combination of them that cannot work."""

    kind = "config error"


class DataError(UserError, ValueError):
    """A data file or row that cannot be used; the message names file, line and field."""

    kind = "data error"


class TemplateError(UserError, ValueError):
    """A chat template that cannot render the data the way training needs."""

    kind = "template error"


class PathError(UserError, FileNotFoundError):
    """A model, adapter, checkpoint or output path that is missing or of the wrong kind."""

    kind = "path error"


class ExportError(UserError, RuntimeError):
    """A GGUF that cannot be written, or whose check does not match the source model."""

    kind = "export error"
