"""Reading a dataset's file: a damaged file is one line naming the file and its dataset, and where
the data folder ships a ``SHA256SUMS`` (``sha256sum``'s format, as ``../shared/data`` has) the file
is checked against it before it is decoded.

A truncated gzip file failed with ``CRC check failed`` and a damaged xz file with a 41-line
traceback, neither naming the file. ``read_checked`` wraps every loader's read: the checksum first
(where one is listed: a file that does not match is damaged or replaced, whatever its decoder would
make of it), then the reader, whose failure becomes a ``DataFileError`` naming both. A file whose
checksum matched is not hashed again in the same process (keyed by its size and modification time).
"""

from __future__ import annotations

import functools
import hashlib
import os
from typing import Callable, TypeVar

SUMS_FILE = "SHA256SUMS"

T = TypeVar("T")


class DataFileError(OSError):
    """A data file that cannot be read or does not match its checksum; one line naming it and its
    dataset."""


def read_checked(path: str, dataset: str, read: Callable[[str], T]) -> T:
    """``read(path)``, after checking ``path`` against the ``SHA256SUMS`` of its folder or the
    folder above it (where either lists it); a damaged file raises ``DataFileError``."""
    verify(path, dataset)
    try:
        return read(path)
    except FileNotFoundError:
        raise
    except Exception as error:  # noqa: BLE001  (gzip, lzma, zip, HDF5 and numpy each raise their own)
        if isinstance(error.__cause__, ImportError):  # a missing reader (h5py), not a bad file
            raise
        raise DataFileError(
            f"{dataset}: cannot read {path}: {type(error).__name__}:"
            f" {' '.join(str(error).split())[:200]}; the file is damaged or not the expected"
            " format: replace it"
        ) from error


def verify(path: str, dataset: str) -> None:
    """Raises ``DataFileError`` if a ``SHA256SUMS`` beside ``path`` (or one folder up) lists it
    with another sha256; nothing where none lists it."""
    listed = expected_sha256(path)
    if listed is None:
        return
    sums, expected = listed
    stat = os.stat(path)
    actual = _sha256(os.path.abspath(path), stat.st_size, stat.st_mtime_ns)
    if actual != expected:
        raise DataFileError(
            f"{dataset}: {path} does not match its sha256 in {sums} (expected {expected[:16]}...,"
            f" got {actual[:16]}...): the file is damaged or was replaced; restore it"
        )


def expected_sha256(path: str) -> tuple[str, str] | None:
    """``(the SHA256SUMS file, the sha256 it lists for path)``, from path's folder or the one above
    it; None where neither lists it."""
    folder = os.path.dirname(os.path.abspath(path))
    for root in (folder, os.path.dirname(folder)):
        sums = os.path.join(root, SUMS_FILE)
        if os.path.isfile(sums):
            relative = os.path.relpath(os.path.abspath(path), root)
            digest = _listed(sums).get(relative)
            if digest is not None:
                return sums, digest
    return None


def _listed(sums: str) -> dict[str, str]:
    """``relative path -> sha256`` of a ``sha256sum`` file (``<hex>  <path>``, or ``<hex> *<path>``
    for binary mode)."""
    entries = {}
    with open(sums) as f:
        for line in f:
            digest, _, name = line.strip().partition(" ")
            if len(digest) == 64 and name:
                entries[os.path.normpath(name.strip().lstrip("*"))] = digest.lower()
    return entries


@functools.lru_cache(maxsize=64)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    """The file's sha256 (cached per size and modification time: a changed file is hashed again)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
