"""Sharding with known example ids: 3 Horovod ranks on localhost, each training
example consumed exactly once per epoch across the ranks (``--record-ids``)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.quick,
    pytest.mark.skipif(importlib.util.find_spec("horovod") is None, reason="horovod is not installed in this Python"),
]

ROOT = Path(__file__).resolve().parents[2]
HOROVODRUN = Path(sys.executable).with_name("horovodrun")
EXAMPLES = 300  # 240 train after the 20% test split: 80 per rank, 8 batches of 10
RANKS, BATCH, EPOCHS, SEED = 3, 30, 2, 5


def write_ids_npz(path: Path) -> None:
    """x[:, 0] is the example's id; the other features are noise; 3 classes."""
    rng = np.random.default_rng(0)
    x = np.concatenate([np.arange(EXAMPLES, dtype=np.float32)[:, None], rng.random((EXAMPLES, 3), np.float32)], 1)
    np.savez(path, x=x, y=np.arange(EXAMPLES, dtype=np.int32) % 3)


def test_horovod_ranks_consume_each_training_id_once_per_epoch(tmp_path):
    data, run_dir = tmp_path / "ids.npz", tmp_path / "run"
    write_ids_npz(data)
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [str(HOROVODRUN), "-np", str(RANKS), "-H", f"localhost:{RANKS}", "--gloo",
         sys.executable, "-m", "trainer", "--strategy", "horovod", "--data", str(data), "--record-ids",
         "--epochs", str(EPOCHS), "--batch-size", str(BATCH), "--seed", str(SEED),
         "--run-dir", str(run_dir), "--model-dir", str(tmp_path / "model")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, start_new_session=True,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]

    from trainer.data import load_split  # after the run: imports TensorFlow

    train_ids = sorted(int(i) for i in load_split(str(data), SEED).x_train[:, 0])
    assert len(train_ids) == EXAMPLES * 4 // 5
    records = [json.loads((run_dir / f"ids.rank-{rank}.json").read_text()) for rank in range(RANKS)]
    assert [record["task"] for record in records] == [f"rank-{rank}" for rank in range(RANKS)]
    for epoch in range(EPOCHS):
        per_rank = [record["epochs"][epoch] for record in records]
        seen = Counter(i for ids in per_rank for i in ids)
        twice = sorted(i for i, n in seen.items() if n > 1)
        assert not twice, f"epoch {epoch}: ids seen more than once: {twice[:20]}"
        assert sorted(seen) == train_ids, f"epoch {epoch}: missing {sorted(set(train_ids) - set(seen))[:20]}"
        assert not set.intersection(*(set(ids) for ids in per_rank))
    # Each epoch is reshuffled: the ranks do not replay the same order.
    assert records[0]["epochs"][0] != records[0]["epochs"][1]
