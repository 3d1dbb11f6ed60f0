"""On PYTHONPATH, hides psutil from profkit so that a capture samples no host CPU: a replay against the stand-in `vllm`
must decide from the recordings alone, not from the CPU its stand-in processes happen to use on a loaded machine."""

raise ImportError("psutil hidden for a replay (tests/fakes/nohost)")
