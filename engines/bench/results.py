"""Raw results as `results/` keeps them: JSON, gzip-compressed where the name ends in `.gz`.

Every measurement that writes a file the docs quote writes it through `write_json`, and every
report that reads one back (`voxfleet bench --from-json`, `make autoscale --report-only`,
`python -m engines.bench.gateway summary`) through `read_json`, so that `.json` and `.json.gz`
are one format. Compressed files are written without a timestamp in their header, so that
the same data gives the same bytes.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any


def write_json(path: Path, data: Any, **dumps: Any) -> None:
    """`data` as JSON to `path` (its folder made): compact and gzip-compressed for a `.gz`
    name, indented otherwise. `dumps` goes to `json.dumps` (`default=`, for instance)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        text = json.dumps(data, separators=(",", ":"), **dumps) + "\n"
        path.write_bytes(gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0))
    else:
        path.write_text(json.dumps(data, indent=1, **dumps) + "\n", encoding="utf-8")


def read_json(path: Path) -> Any:
    """The JSON in `path`, decompressed where its name ends in `.gz`."""
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    return json.loads(raw.decode("utf-8"))


def stem(path: Path) -> str:
    """`path`'s name without `.json` or `.json.gz`: what a plot or page beside it is named."""
    name = path.name
    for suffix in (".json.gz", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem
