"""A reader for IDX files, the format of MNIST and Fashion-MNIST (gzip-compressed or not).

IDX (LeCun et al., http://yann.lecun.com/exdb/mnist/, "FILE FORMATS FOR THE MNIST DATABASE"): a 4-byte
magic number ``0x00 0x00 T D`` (``T`` the element type, ``D`` the number of dimensions), then ``D``
sizes as big-endian unsigned 32-bit integers, then the elements in C order, big-endian. Image files
are ``ubyte`` with D = 3 (``0x00000803``: count, rows, columns), label files ``ubyte`` with D = 1
(``0x00000801``). A file is read as gzip when it starts with gzip's magic bytes, whatever its name.

Every defect (a wrong magic number, a header or body shorter or longer than the sizes announce, a
broken gzip stream, images and labels that disagree) raises :class:`IdxFormatError` naming the file.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Optional, Tuple, Union

import numpy as np

from flatlab.workloads.sources import DataUnavailable

#: IDX element type codes -> numpy dtypes (big-endian where it matters)
IDX_TYPES = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
UBYTE = 0x08
_GZIP_MAGIC = b"\x1f\x8b"

PathLike = Union[str, Path]


class IdxFormatError(DataUnavailable):
    """An IDX file that cannot be read as announced (the message names the file and the defect)."""


def _raw_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataUnavailable(f"cannot read IDX file {path}: {exc.strerror or exc}") from exc
    if raw[:2] != _GZIP_MAGIC:
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, OSError, zlib.error) as exc:  # truncated stream, bad CRC, not gzip after all
        raise IdxFormatError(
            f"IDX file {path}: broken gzip stream ({type(exc).__name__}: {exc}); is the download complete?"
        ) from exc


def read_idx(path: PathLike, ndim: Optional[int] = None, type_code: Optional[int] = UBYTE) -> np.ndarray:
    """The array stored in IDX file ``path`` (``.gz`` or plain).

    Args:
        path: the file.
        ndim: the number of dimensions the file must have (None: any).
        type_code: the IDX element type it must have (``0x08`` = unsigned byte; None: any).
    Returns:
        an array of the sizes in the header; ``uint8`` for ubyte files, otherwise the IDX type in
        native byte order.
    Raises:
        IdxFormatError: a wrong magic number (other type or dimensions than asked, or not IDX at all),
            a header or body shorter than announced, bytes beyond it, a broken gzip stream; the message
            names ``path``.
        DataUnavailable: the file cannot be read (missing, no permission).
    """
    path = Path(path)
    raw = _raw_bytes(path)
    if len(raw) < 4:
        raise IdxFormatError(f"IDX file {path}: truncated, {len(raw)} bytes, shorter than the 4-byte magic number")
    magic = int.from_bytes(raw[:4], "big")
    code, dims = raw[2], raw[3]
    expected = f"0x0000{type_code if type_code is not None else code:02X}{ndim if ndim is not None else dims:02X}"
    if (
        raw[0]
        or raw[1]
        or code not in IDX_TYPES
        or dims == 0
        or (ndim is not None and dims != ndim)
        or (type_code is not None and code != type_code)
    ):
        raise IdxFormatError(
            f"IDX file {path}: wrong magic number 0x{magic:08X}, expected {expected} "
            f"(IDX, element type 0x{type_code or code:02X}, {ndim or dims} dimension(s))"
        )
    header = 4 + 4 * dims
    if len(raw) < header:
        raise IdxFormatError(f"IDX file {path}: truncated header, {len(raw)} bytes, {header} needed for {dims} sizes")
    shape = tuple(int(s) for s in np.frombuffer(raw, dtype=">u4", count=dims, offset=4))
    dtype = IDX_TYPES[code]
    need = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    have = len(raw) - header
    if have != need:
        what = "truncated" if have < need else "too long"
        raise IdxFormatError(
            f"IDX file {path}: {what}, {have} bytes of data after the header, "
            f"{need} announced by its sizes {'x'.join(map(str, shape))}"
        )
    arr = np.frombuffer(raw, dtype=dtype, count=need // dtype.itemsize, offset=header).reshape(shape)
    return arr.astype(dtype.newbyteorder("="), copy=True)  # writable, native byte order


def read_idx_pair(
    images: PathLike, labels: PathLike, image_shape: Optional[Tuple[int, ...]] = None, num_classes: Optional[int] = None
) -> Tuple[np.ndarray, np.ndarray]:
    """Images and labels from two IDX ubyte files that must agree.

    Args:
        images: a 3-d ubyte file ``(N, rows, cols)``; labels: a 1-d ubyte file ``(N,)``.
        image_shape: ``(rows, cols)`` the images must have (None: any).
        num_classes: labels must lie in ``[0, num_classes)`` (None: unchecked).
    Returns:
        ``(x, y)``: ``(N, rows, cols)`` uint8 and ``(N,)`` int64.
    Raises:
        IdxFormatError: a defect of either file (see :func:`read_idx`); counts that differ (naming
            both files); other image sizes than ``image_shape``; a label outside the classes.
    """
    x = read_idx(images, ndim=3)
    y = read_idx(labels, ndim=1)
    if x.shape[0] != y.shape[0]:
        raise IdxFormatError(
            f"IDX files disagree: {images} holds {x.shape[0]} images, {labels} holds {y.shape[0]} labels"
        )
    if image_shape is not None and tuple(x.shape[1:]) != tuple(image_shape):
        raise IdxFormatError(
            f"IDX file {images}: images of {x.shape[1]}x{x.shape[2]} pixels, expected {'x'.join(map(str, image_shape))}"
        )
    if num_classes is not None and y.size and int(y.max()) >= num_classes:
        raise IdxFormatError(f"IDX file {labels}: label {int(y.max())} outside [0, {num_classes})")
    return x, y.astype(np.int64)
