"""A PyTorch program for an elastic torchrun run that trains until its world has been formed again (torchrun restarts
the workers whenever a node goes or comes) at its full size, then a few epochs more, so a test of a replacement
joining cannot be raced by the training ending first. The agents left wait a while for more nodes before they form
the new world, so a replacement that comes soon enough is in it at once (the world never shows fewer ranks). What
the workers remember (the epoch, the model, each world's size) is in a checkpoint every node keeps, and the
process with the newest one sends it to the others, so a new node learns it.

    torchrun ... torch_regrow.py --size 3 --after 3
"""

import argparse
import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, required=True, help="the world's full size")
    parser.add_argument("--after", type=int, default=3, help="epochs to train once grown back")
    parser.add_argument("--limit", type=int, default=600, help="epochs at most (then fail: it never grew back)")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds each epoch takes at least")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=15))
    rank, world = dist.get_rank(), dist.get_world_size()
    path = os.path.join(os.environ["KILN_CHECKPOINT_DIR"], "regrow.pt")
    state = torch.load(path, weights_only=False) if os.path.exists(path) else {"epoch": 0, "sizes": []}
    epochs = [None] * world
    dist.all_gather_object(epochs, state["epoch"])
    box = [state]
    dist.broadcast_object_list(box, src=epochs.index(max(epochs)))
    state = box[0]
    state["sizes"].append(world)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(8, 1))
    if "model" in state:
        model.module.load_state_dict(state["model"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if rank == 0:
        print(f"epoch {state['epoch']} on {world} ranks (sizes so far {state['sizes']})", flush=True)
    while True:
        sizes = state["sizes"]
        formed_again = len(sizes) > 1
        regrown_at = state.get("regrown_at")
        if formed_again and world == args.size and regrown_at is None:
            regrown_at = state["regrown_at"] = state["epoch"]
        if regrown_at is not None and state["epoch"] >= regrown_at + args.after:
            break
        if state["epoch"] >= args.limit:
            return 1
        features = torch.randn(64, 8)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(features), features.sum(1, keepdim=True)).backward()
        optimizer.step()
        state["epoch"] += 1
        state["model"] = model.module.state_dict()
        if int(os.environ["LOCAL_RANK"]) == 0:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            torch.save(state, path + ".tmp")
            os.replace(path + ".tmp", path)
        if rank == 0:
            print(f"epoch {state['epoch']} on {world} ranks", flush=True)
        time.sleep(args.pause)
    out = os.environ["KILN_OUTPUT_DIR"]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as handle:
        json.dump({"rank": rank, "size": world, "sizes": state["sizes"], "epochs": state["epoch"],
                   "regrown_at": state["regrown_at"]}, handle)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
