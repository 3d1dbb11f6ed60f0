"""profkit: profiling and bottleneck diagnosis for vLLM inference.

The library's entry points are in `profkit.api` (each returns the JSON document its command prints):

    from profkit.api import report, diff, predict, render, schema
    doc = report("samples/vllm_14b_kv_bound")          # profkit.report/1
    diff("before/", "after/")                           # profkit.diff/1
    predict("samples/vllm_14b_kv_bound", "--kv-cache-dtype fp8")   # profkit.prediction/1
    print(render(doc, "md"))                            # text, md, html or json
    schema("report")                                    # its JSON Schema (also `profkit schema report`)

Bad input raises `profkit.ProfkitError` carrying the one line the command line prints.
"""

from profkit.errors import ProfkitError

__version__ = "0.1.0"
__all__ = ["ProfkitError", "__version__"]
