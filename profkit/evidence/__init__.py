"""Readers of everything a run leaves that is not a trace: vLLM's benchmark JSON, its logs, Prometheus
scrapes of /metrics, the host samples and the capture manifest. Each reader checks its file (a regular file
of bounded size, see `profkit.inputs`), parses it once and returns a typed record; analyses take records,
never paths. `record.Evidence` holds a run's records together, from a capture folder or the files named."""
