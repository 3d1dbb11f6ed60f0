"""The vLLM vocabulary every stage speaks: a vLLM command line (parsed and edited in the user's own spelling), the
option lists and spellings recorded per vLLM version, vLLM's defaults, and the checks of a command against them.
It sits at the bottom of the stages: capture, diagnose, compare and tune all use it, and it imports none of them."""
