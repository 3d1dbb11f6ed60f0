"""profkit: profiling and bottleneck diagnosis for vLLM inference."""

from profkit.errors import ProfkitError

__version__ = "0.1.0"
__all__ = ["ProfkitError", "__version__"]
