"""Read traces (nsys SQLite, torch.profiler JSON) into the normalized `Trace`."""

from profkit.traces.model import Trace
from profkit.traces.open import open_trace

__all__ = ["Trace", "open_trace"]
