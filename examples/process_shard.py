"""One process of `kiln run`: handle this process's share of the inputs and write what it made to its output.

    kiln -H h1,h2,h3 run --shard-input items.txt -- python process_shard.py

Each process reads its items from the file KILN_SHARD_INPUTS (one per line; every item goes to exactly one
process) and writes to KILN_OUTPUT_DIR, which kiln brings back to the run folder.
"""

import hashlib
import os
from pathlib import Path


def main() -> None:
    index, count = int(os.environ["KILN_SHARD_INDEX"]), int(os.environ["KILN_SHARD_COUNT"])
    items = Path(os.environ["KILN_SHARD_INPUTS"]).read_text().splitlines()
    output = Path(os.environ.get("KILN_OUTPUT_DIR", "."))
    output.mkdir(parents=True, exist_ok=True)
    with open(output / "processed.tsv", "w") as handle:
        for item in items:
            handle.write(f"{item}\t{hashlib.sha256(item.encode()).hexdigest()[:12]}\n")
    print(f"shard {index} of {count}: {len(items)} item(s)", flush=True)


if __name__ == "__main__":
    main()
