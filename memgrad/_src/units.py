"""Byte sizes: parsing ``"512MB"``-style strings and formatting byte counts. Imports nothing of memgrad."""

from __future__ import annotations

import math
import re

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "K": 2**10,
    "M": 2**20,
    "G": 2**30,
    "T": 2**40,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*$")


def parse_bytes(size) -> int:
    """Converts a byte size such as ``"512MB"``, ``"1.5GiB"`` or ``4096`` to bytes.

    Decimal units (KB, MB, GB, TB) are powers of 1000; binary units (KiB, MiB,
    GiB, TiB, or the bare letters K, M, G, T) are powers of 1024.

    Args:
      size: a non-negative int or finite float of bytes, or a string: a number
        followed by an optional unit.

    Returns:
      The size in bytes, as an int.

    Raises:
      ValueError: if ``size`` is negative, not finite (NaN, infinity, or too
        large for a float once scaled by its unit) or not a recognised size.

    Example:
      >>> parse_bytes("512MiB")
      536870912
      >>> parse_bytes("1.5GB")
      1500000000
    """
    if isinstance(size, bool):
        raise ValueError(f"Expected a byte size such as '512MB' or 4096. Received: {size!r}")
    if isinstance(size, (int, float)):
        value, unit = size, ""  # an int stays exact: float() would round or overflow a huge one
    elif isinstance(size, str):
        match = _SIZE_PATTERN.match(size)
        if not match or match.group(2).upper() not in _UNITS:
            raise ValueError(
                "Expected a byte size: a number with an optional unit "
                f"(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. '512MB'. Received: {size!r}"
            )
        value, unit = float(match.group(1)), match.group(2).upper()
    else:
        raise ValueError(f"Expected a byte size such as '512MB' or 4096. Received: {size!r}")
    total = value * _UNITS[unit]
    if isinstance(total, float) and not math.isfinite(total):
        raise ValueError(f"Expected a finite, non-negative byte size such as '512MB' or 4096. Received: {size!r}")
    if value < 0:
        raise ValueError(f"Expected a non-negative byte size. Received: {size!r}")
    return int(round(total))


def format_bytes(num_bytes: float) -> str:
    """Formats a byte count with a binary unit, e.g. ``format_bytes(3 * 2**20) == '3.00 MiB'``.

    Args:
      num_bytes: a number of bytes.

    Returns:
      A short human-readable string.
    """
    magnitude = abs(num_bytes)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if magnitude >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{int(num_bytes)} B"
