"""JAX across nodes: `jax.distributed.initialize()` with no arguments, as JAX's multi-process guide writes it for a
cluster it detects; kiln tells every process its coordinator, count and id. Each process puts its own value on
each of its devices; one jitted sum over the global array adds them across every process and device.

    kiln train --mode jax -- python jax_sum.py

Each process writes what it saw to KILN_OUTPUT_DIR/result.json.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec


def main() -> None:
    jax.distributed.initialize()
    index, count = jax.process_index(), jax.process_count()
    mesh = jax.make_mesh((jax.device_count(),), ("d",))
    local = np.full((jax.local_device_count(),), index + 1.0, dtype=np.float32)
    values = multihost_utils.host_local_array_to_global_array(local, mesh, PartitionSpec("d"))
    total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, PartitionSpec()))(values)
    total = float(multihost_utils.process_allgather(total, tiled=True))
    expected = sum((p + 1.0) * jax.local_device_count() for p in range(count))
    print(f"process {index}/{count}: {jax.local_device_count()} {jax.default_backend()} device(s), sum {total} "
          f"(expected {expected})", flush=True)
    out = os.environ.get("KILN_OUTPUT_DIR", ".")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "result.json"), "w") as handle:
        json.dump({"process": index, "processes": count, "devices": jax.device_count(),
                   "local_devices": jax.local_device_count(), "backend": jax.default_backend(), "sum": total,
                   "expected": expected}, handle)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
