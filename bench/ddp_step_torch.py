#!/usr/bin/env python3
"""The PyTorch twin of bench/ddp_step.cc: the same MLP step under torch DDP (gloo).

Launch it like any torch.distributed program; ringtrain's launcher sets the
variables torch reads (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE):
    build/comm/ringrun --nproc-per-node 2 python3 bench/ddp_step_torch.py --json out.json
One compute thread per rank (torch.set_num_threads(1)), batch 64 per rank, f32,
SGD, default DDP bucket caps (25 MiB, first 1 MiB). Timed as bench/ddp_step is:
local and DDP steps in alternating rounds (one warm-up step, then --steps timed,
per configuration per round), each step the slowest rank's time (max over ranks),
medians over all rounds.
Correctness while timing, as in bench/ddp_step: the local model, after every step it
ran, must have moved as a fresh model from the same weights moves in as many steps
on the same batch, replayed alone (each parameter's change within 1e-3 of the largest
element of the replay's change); the replicas must hold identical
parameters at the end, and one more DDP backward must give every parameter the
gradient one process computes on the global batch (every rank's data, rebuilt from
the seeds) with the same weights, within 1e-4 of that parameter's largest gradient.
"""
import argparse
import json
import os
import statistics
import sys
import time

from bench_args import at_least

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

torch.set_num_threads(1)


def make_mlp(a):
    torch.manual_seed(1)
    layers, width = [], a.in_features
    for _ in range(a.hidden):
        layers += [nn.Linear(width, a.width), nn.ReLU()]
        width = a.width
    layers.append(nn.Linear(width, a.classes))
    return nn.Sequential(*layers)


def time_one_step(step, world):
    if world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    step()
    t = torch.tensor([(time.perf_counter() - t0) * 1000.0], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--in-features", type=at_least(1), default=784)
    p.add_argument("--width", type=at_least(1), default=1024)
    p.add_argument("--hidden", type=at_least(0), default=4)
    p.add_argument("--classes", type=at_least(1), default=10)
    p.add_argument("--batch", type=at_least(1), default=64)
    p.add_argument("--warmup", type=at_least(0), default=3)
    p.add_argument("--rounds", type=at_least(1), default=5)
    p.add_argument("--steps", type=at_least(1), default=3, help="timed steps per configuration per round")
    p.add_argument("--json", default="")
    p.add_argument("--gradient-as-bucket-view", action="store_true")
    a = p.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    dist.init_process_group("gloo", init_method="env://", world_size=world, rank=rank)
    def batch_of(r):
        """Rank r's batch; any rank can rebuild the global batch from the seeds."""
        g = torch.Generator().manual_seed(100 + r)
        bx = torch.randn(a.batch, a.in_features, generator=g)
        return bx, (torch.rand(a.batch, generator=g) * a.classes).long()

    x, y = batch_of(rank)
    loss_fn = nn.CrossEntropyLoss()

    local = make_mlp(a)
    opt_local = torch.optim.SGD(local.parameters(), lr=0.01)

    local_steps = 0  # every call, warm-up and timed: the replay below runs as many

    def local_step():
        nonlocal local_steps
        local_steps += 1
        opt_local.zero_grad()
        loss_fn(local(x), y).backward()
        opt_local.step()

    model = nn.parallel.DistributedDataParallel(
        make_mlp(a), gradient_as_bucket_view=a.gradient_as_bucket_view)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def ddp_step():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    times = {local_step: [], ddp_step: []}
    for _ in range(a.warmup):
        local_step()
        ddp_step()
    for _ in range(a.rounds):
        for step, samples in times.items():
            step()
            samples += [time_one_step(step, world) for _ in range(a.steps)]
    t_local, t_ddp = statistics.median(times[local_step]), statistics.median(times[ddp_step])

    checksum = torch.tensor([float(sum(p.double().sum() for p in model.parameters()))], dtype=torch.float64)
    lo, hi = checksum.clone(), checksum.clone()
    if world > 1:
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    wrong = int(lo.item() != hi.item())
    # The local model's result: its change since the initial weights against a replay of
    # its steps alone (changes, not weights: one step is ~1e-3 of a weight).
    replay, initial = make_mlp(a), make_mlp(a)
    opt_replay = torch.optim.SGD(replay.parameters(), lr=0.01)
    for _ in range(local_steps):
        opt_replay.zero_grad()
        loss_fn(replay(x), y).backward()
        opt_replay.step()
    with torch.no_grad():
        for (name, p_local), p_replay, p_initial in zip(local.named_parameters(), replay.parameters(),
                                                        initial.parameters()):
            change, replay_change = p_local - p_initial, p_replay - p_initial
            err = (change - replay_change).abs().max().item()
            scale = replay_change.abs().max().item()
            if not err <= 1e-3 * scale:
                print(f"ddp_step_torch: rank {rank}: the local model: the change of '{name}' differs from its "
                      f"{local_steps} steps replayed alone by {err:.3g} (largest element {scale:.3g})",
                      file=sys.stderr)
                wrong = 1
    # The gradients themselves, against one process on the global batch.
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    reference = make_mlp(a)
    reference.load_state_dict(model.module.state_dict())
    batches = [batch_of(r) for r in range(world)]
    loss_fn(reference(torch.cat([b[0] for b in batches])), torch.cat([b[1] for b in batches])).backward()
    for (name, p_ddp), p_ref in zip(model.module.named_parameters(), reference.parameters()):
        err = (p_ddp.grad - p_ref.grad).abs().max().item()
        scale = p_ref.grad.abs().max().item()
        if not err <= 1e-4 * scale + 1e-7:
            print(f"ddp_step_torch: rank {rank}: the gradient of '{name}' differs from the single-process "
                  f"gradient of the global batch by {err:.3g} (largest gradient {scale:.3g})", file=sys.stderr)
            wrong = 1
    flag = torch.tensor([wrong], dtype=torch.int64)
    if world > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    wrong = int(flag.item())
    if rank == 0:
        print(f"# local model equal to its {local_steps} steps replayed alone, replicas identical, DDP gradients "
              f"equal to the global batch's: #wrong = {wrong}", file=sys.stderr)
        result = {"world": world, "torch": torch.__version__, "t_local_ms": t_local, "t_ddp_ms": t_ddp, "wrong": wrong}
        print(json.dumps(result))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=2)
    if world > 1:
        dist.barrier()  # leave together; torch 1.13's gloo can spin in destroy_process_group
    return 1 if wrong else 0


if __name__ == "__main__":
    code = main()
    # Leave without running torch 1.13's teardown: its gloo context sometimes dies
    # in a destructor at interpreter exit ("terminate called without an active
    # exception", SIGABRT) after all results were written.
    sys.stdout.flush()
    os._exit(code)
