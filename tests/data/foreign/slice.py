"""How the sliced traces here were made from the public originals (README.md): keep the metadata, the
`ph: M` events and every event that starts in the first `keep` kernels' time span, in their original order."""

import gzip
import json
import sys

src, dst, keep = sys.argv[1], sys.argv[2], int(sys.argv[3])
with gzip.open(src) if src.endswith(".gz") else open(src, "rb") as f:
    doc = json.load(f)
events = doc if isinstance(doc, list) else doc["traceEvents"]
kernels = sorted(e["ts"] for e in events if str(e.get("cat", "")).lower() == "kernel" and e.get("ph") == "X")
lo, hi = kernels[0], kernels[min(keep, len(kernels)) - 1]
lo -= 20_000  # the launch calls of the first kernels (20 ms before)
kept = [e for e in events if e.get("ph") == "M" or (isinstance(e.get("ts"), (int, float)) and lo <= e["ts"] <= hi)]
out = kept if isinstance(doc, list) else {**doc, "traceEvents": kept}
with gzip.open(dst, "wt") as f:
    json.dump(out, f)
