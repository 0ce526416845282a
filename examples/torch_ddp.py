"""PyTorch DistributedDataParallel across nodes, written as PyTorch's own torchrun tutorial writes it: the process
group from the environment torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), a
DistributedSampler, and a checkpoint in KILN_CHECKPOINT_DIR to resume from after a restart.

    kiln train --mode torchrun -- python torch_ddp.py --epochs 5
    kiln train --mode torchrun --min-np 2 --max-np 3 -- python torch_ddp.py   # elastic: nodes may go and come

NCCL on GPUs (one process per GPU, each on its own), Gloo on CPUs. Every node's first process keeps a checkpoint
after each epoch; on a start (or torchrun's restart of the workers after a node went or came) the process with
the newest one sends it to the others, so a fresh node resumes at the same epoch. Each process writes what it did
to KILN_OUTPUT_DIR/rank-N.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--pause", type=float, default=0.0, help="seconds to wait after each epoch")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a collective may wait for a peer")
    return parser.parse_args()


def synthetic(samples: int) -> TensorDataset:
    """The same regression data on every process: y = Xw + noise."""
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(samples, 32, generator=generator)
    weights = torch.randn(32, 1, generator=generator)
    return TensorDataset(features, features @ weights + 0.01 * torch.randn(samples, 1, generator=generator))


def checkpoint_path() -> str:
    return os.path.join(os.environ.get("KILN_CHECKPOINT_DIR", "checkpoints"), "ddp.pt")


def resume(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """The epoch to start at: every process reads its node's checkpoint, if any; the first holding the newest sends
    it to all, so every process starts from the same state."""
    path = checkpoint_path()
    state = torch.load(path, map_location="cpu", weights_only=False) if os.path.exists(path) else {"epoch": 0}
    epochs = [None] * dist.get_world_size()
    dist.all_gather_object(epochs, state["epoch"])
    newest = max(epochs)
    if newest == 0:
        return 0
    box = [state]
    dist.broadcast_object_list(box, src=epochs.index(newest))
    model.load_state_dict(box[0]["model"])
    optimizer.load_state_dict(box[0]["optimizer"])
    return newest


def save(model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int) -> None:
    path = checkpoint_path()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, path + ".tmp")
    os.replace(path + ".tmp", path)


def main() -> None:
    args = parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()

    dataset = synthetic(args.samples)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    start = resume(model, optimizer)
    if rank == 0:
        print(f"world {world} ({backend} on {device.type}), from epoch {start}", flush=True)

    loss = torch.zeros((), device=device)
    batches = 0
    for epoch in range(start, args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2, device=device)
        for features, target in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(ddp(features.to(device)), target.to(device))
            loss.backward()
            optimizer.step()
            total += torch.stack([loss.detach() * len(features), torch.tensor(float(len(features)), device=device)])
            batches += 1
        dist.all_reduce(total)
        mean = (total[0] / total[1]).item()
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs} loss {mean:.4f}", flush=True)
        if local_rank == 0:
            save(model, optimizer, epoch + 1)
        time.sleep(args.pause)

    out = os.environ.get("KILN_OUTPUT_DIR", ".")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as handle:
        json.dump({"rank": rank, "world": world, "backend": backend, "device": str(device), "started_at": start,
                   "epochs": args.epochs, "batches": batches, "loss": mean if args.epochs > start else None,
                   "group_rank": int(os.environ.get("GROUP_RANK", -1))}, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
