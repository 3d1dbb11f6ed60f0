"""Read traces (nsys SQLite, torch.profiler JSON) into the normalized `Trace`."""

from profkit.traces.open import open_trace
from profkit.traces.schema import Trace

__all__ = ["Trace", "open_trace"]
