"""Errors a user can hit, each class with its own exit code.

The CLI prints ``edgec: error: <message>`` and exits with ``exit_code``; the message names the thing
that is wrong and, where there is one, the fix. Anything else that escapes is an internal error.
"""


class EdgecError(Exception):
    """Base class of errors caused by the user's input or environment, not by an edgec bug."""

    exit_code = 2


class InputFileError(EdgecError):
    """A file or directory the user named is missing or unreadable."""

    exit_code = 3


class ModelError(EdgecError):
    """The model is not valid ONNX, or uses something edgec cannot handle."""

    exit_code = 4


class SamplesError(EdgecError):
    """Sample inputs do not fit the model: names, dtypes, ranks or dims."""

    exit_code = 5


class TargetError(EdgecError):
    """An unknown or malformed target description."""

    exit_code = 6


class ArtifactError(EdgecError):
    """An artifact that is corrupt, tampered with, or of an unsupported format version."""

    exit_code = 7


class CompileError(EdgecError):
    """The compiler could not lower or build the model."""

    exit_code = 8


class ToolchainError(EdgecError):
    """A required external tool (cross compiler, emulator, native library) is missing."""

    exit_code = 9


class StageInputError(EdgecError):
    """A saved stage result (profile, plan, bench result) is missing fields or of another version."""

    exit_code = 10


class OutputFileError(EdgecError):
    """An output file could not be written: no space left, read-only or forbidden folder."""

    exit_code = 12


def describe(exc: BaseException, limit: int = 300) -> str:
    """The message of a foreign exception as one line, without the C++ backtrace TVM prepends."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(("File ", "Stack trace", "[bt]"))
             and not line[:1].isdigit()]
    message = lines[-1] if lines else type(exc).__name__
    return message[:limit]
