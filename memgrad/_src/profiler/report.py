"""The memory report returned by `measure`."""

from __future__ import annotations

import dataclasses

from memgrad._src.units import format_bytes


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """What one measured call of a function used.

    Attributes:
      device: the device measured, e.g. ``'CPU:0'`` or ``'GPU:0'``.
      peak_bytes: the allocator's peak of live tensor bytes during the call.
      baseline_bytes: tensor bytes already live before the call (weights,
        inputs, anything the caller holds).
      wall_time_s: wall time of the measured call, in seconds (median over
        repeats).
    """

    device: str
    peak_bytes: int
    baseline_bytes: int
    wall_time_s: float

    @property
    def peak_above_baseline_bytes(self) -> int:
        """Peak minus baseline: what the call itself added at its worst moment."""
        return self.peak_bytes - self.baseline_bytes

    def as_dict(self) -> dict:
        """The report as a plain dict (JSON-serialisable)."""
        fields = dataclasses.asdict(self)
        fields["peak_above_baseline_bytes"] = self.peak_above_baseline_bytes
        return fields

    def __str__(self) -> str:
        return (
            f"MemoryReport(device={self.device}, peak={format_bytes(self.peak_bytes)}, "
            f"baseline={format_bytes(self.baseline_bytes)}, "
            f"above baseline={format_bytes(self.peak_above_baseline_bytes)}, "
            f"time={self.wall_time_s * 1e3:.1f} ms)"
        )
