"""Errors a user can act on.

Every error raised on bad input is a ``FedcacheError`` whose message says what was
wrong and how to fix it. Subclasses also inherit the matching builtin so that code
catching ``ValueError`` / ``FileNotFoundError`` / ``KeyError`` keeps working.
"""
from __future__ import annotations

import os as _os

from fedcache.wording import did_you_mean, named


def debugging() -> bool:
    """Whether FEDCACHE_DEBUG asks for what fedcache keeps out of its output otherwise (tracebacks, a simulation's
    noise once interrupted)."""
    return _os.environ.get("FEDCACHE_DEBUG", "") not in ("", "0")


class FedcacheError(Exception):
    """Base class: the CLI prints these as one red line and exits with code 1."""

    def __reduce__(self):
        # Pickled (a grid's worker process raising it) as its message and attributes: the default pickles the
        # arguments, and a class made from others than its message (a path and a problem) failed to unpickle, so
        # the worker's one-line error reached the grid as a broken pool. An OSError made as one is (errno, text,
        # file), with no __init__ of its own, pickles as OSError does, its fields kept.
        own_init = any("__init__" in vars(c) for c in type(self).__mro__ if issubclass(c, FedcacheError))
        if isinstance(self, OSError) and not own_init:
            return super().__reduce__()
        return _unpickled, (type(self), self.args, self.__dict__)


def _unpickled(cls: type, args: tuple, state: dict) -> FedcacheError:
    error = cls.__new__(cls, *args)
    error.args = args  # OSError's __new__ leaves them to an __init__ of its own, which a subclass replaces
    error.__dict__.update(state)
    return error


class ConfigError(FedcacheError, ValueError):
    """A bad option value or combination of options."""


class UnknownOptionError(ConfigError, TypeError):
    """Options a call does not take (``fedcache.grid(method=...)``, ``fedcache.train(round=5)``, a RunSpec's, an
    extraction's): each named with the one likely meant (``advice(name)`` where it has better advice, else a close
    name), then the options taken. A TypeError too, as Python's own unexpected keyword argument is, so code that
    caught that keeps working."""

    def __init__(self, unknown, known, advice=None) -> None:
        known = sorted(known)
        said = ", ".join(k + ((advice(k) if advice else "") or did_you_mean(k, known)) for k in sorted(unknown))
        super().__init__(f"unknown option(s) {said}; known: {', '.join(known)}")


class UnknownNameError(FedcacheError, KeyError):
    """A registry lookup for a name that does not exist."""

    def __str__(self) -> str:  # KeyError would wrap the message in quotes
        return str(self.args[0]) if self.args else ""


class DataNotFoundError(FedcacheError, FileNotFoundError):
    """Dataset files are missing; the message says where we looked and how to get them."""


class InputNotFoundError(DataNotFoundError):
    """A file the command was named to read (``store import FILE``) is not there: the command as given is refused."""

    refused_as_given = True


class WeightsNotFoundError(DataNotFoundError):
    """A backbone checkpoint is missing; the message names the file expected."""


class BadImageError(FedcacheError, ValueError):
    """An image file could not be decoded."""


class NonFiniteFeaturesError(FedcacheError, ValueError):
    """A backbone produced NaN or infinite features; the message names the images."""


class DeviceError(FedcacheError, RuntimeError):
    """A requested device (e.g. CUDA) is not available."""


class DecoderDiedError(FedcacheError, RuntimeError):
    """A process decoding an extraction's images ended (killed: out of memory, say); what was written is kept."""


class StoreError(FedcacheError):
    """Something is wrong with the feature store."""


class StoreNotFoundError(StoreError, FileNotFoundError):
    """No feature store at the path given (a run reads one, it never makes one): the command as given is refused."""

    refused_as_given = True


class StoreIsAFileError(StoreError, NotADirectoryError):
    """The store's path is a file: a store is a folder (the command as given is refused)."""

    refused_as_given = True


class EntryNotFoundError(StoreError, KeyError):
    """The store has no (complete) entry for the requested features. ``missing``: ("dataset" or "backbone", name)
    where the store holds no features of that name at all, and ``found`` the message without its advice to extract
    them: the store cannot tell whether fedcache can extract a name (its registries are above it), its caller can."""

    def __init__(self, message: str = "", missing: tuple[str, str] | None = None, found: str = "") -> None:
        super().__init__(message)
        self.missing, self.found = missing, found

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnknownFeaturesError(EntryNotFoundError, UnknownNameError):
    """Features the store lacks of a dataset or backbone no registry knows: a mistyped name (``-b effnet``), said as
    an unknown name is, not as an extraction to run."""


class IncompleteEntryError(StoreError):
    """An entry exists but its extraction has not finished."""


class DamagedEntryError(StoreError):
    """An entry's files no longer hold what was written (a missing, corrupt or foreign chunk or metadata)."""

    def __init__(self, message: str, problem: str = "") -> None:
        super().__init__(message)
        self.problem = problem or message  # what is wrong, without the advice


class UnreadableEntryError(StoreError):
    """An entry this user may not read (another user's, made under a strict umask, or chmod-ed): not damaged, so
    neither to be re-created nor removed; the message names the file and says to have its owner make it readable."""

    def __init__(self, message: str, problem: str = "") -> None:
        super().__init__(message)
        self.problem = problem or message  # what was refused, without the advice


class DamagedCheckpointError(FedcacheError):
    """A run's checkpoint no longer holds what was written (flipped bytes, a truncated file)."""

    def __init__(self, path, problem: str) -> None:
        again = named("another --out (or with --overwrite)", "another out (or with overwrite=True)")
        super().__init__(f"the checkpoint {path} is damaged: {problem}; the run cannot continue from it: start it "
                         f"again in {again}; in a grid, delete the folder holding it and run the grid again")
        self.path = path


class EntryLockedError(StoreError):
    """Another process is writing the same entry."""


class UnknownEntryError(EntryNotFoundError, UnknownNameError):
    """An entry id (or prefix) that no entry of the store has (`store info`, `store rm`): an unknown name."""


class DamagedFileError(FedcacheError, ValueError):
    """A file fedcache wrote (a run's summary.json, a grid's cell.json) is not what it wrote: torn by a crash of an
    older version that wrote it in place, or edited by hand. The message names the file and what to do."""

    def __init__(self, path, problem: str, advice: str) -> None:
        super().__init__(f"{path} is damaged ({problem}; torn by an interrupted write, or edited by hand?); {advice}")
        self.path, self.problem = path, problem


class DirectoryBusyError(FedcacheError):
    """Another fedcache command is writing the directory (a run's, a grid's); the message names it."""


class CellFailedError(FedcacheError):
    """A grid cell (or a batch of cells) raised an error that is not one of fedcache's (a bug, an exhausted
    resource): the message names the cell and the error; the original is ``__cause__`` (in a worker process, its
    traceback is)."""


class DeniedError(FedcacheError, OSError):
    """The file system refused a read or a write that fedcache does not check for first (another user's store or
    directory, a read-only mount): the message names the file and what to do. ``errno`` and ``filename`` are the
    refusal's, so code that catches ``OSError`` and reads them keeps working (the original is ``__cause__``)."""

    def __init__(self, message: str, errno: int | None = None, filename: str | None = None) -> None:
        super().__init__(message)
        self.errno, self.filename = errno, filename
        self.strerror = _os.strerror(errno) if errno else None

    def __str__(self) -> str:  # OSError would say "[Errno 13] Permission denied: ..." once errno is set
        return str(self.args[0]) if self.args else ""

    def __reduce__(self):  # OSError pickles (errno, strerror, filename) as the arguments once a filename is set
        return type(self), (str(self), self.errno, self.filename)


class PermissionDeniedError(DeniedError, PermissionError):
    """A refused permission (EACCES, EPERM): a PermissionError as before, said in one line."""


class DiskFullError(FedcacheError, OSError):
    """A write found no space left (or a quota reached); the message names the path and the space it needs."""

    def __init__(self, what: str, advice: str = "", too_large: bool = False) -> None:
        if too_large:  # a file-size limit: more free space would not help, the rest of the advice still holds
            advice = advice.replace("free some space", "write to a file system that allows larger files (or raise "
                                    "`ulimit -f`)", 1)
        super().__init__(f"{what}; {advice}" if advice else what)
        self.what, self.advice, self.too_large = what, advice, too_large

    def advised(self, advice: str) -> "DiskFullError":
        """The same error with what the caller, who knows more, advises instead."""
        return DiskFullError(self.what, advice, self.too_large)
