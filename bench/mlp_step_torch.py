#!/usr/bin/python3
"""mlp_step_torch.py: the PyTorch side of the MLP step benchmark (bench/mlp_step.cc).

The model, batch and initial values are defined by an integer hash so that
ringtrain's C++ side builds exactly the same network without exchanging files:
  layers  in_features -> width (x hidden) -> classes, ReLU between, cross-entropy
  u(key)    = fmix32(key) / 2^32 in [0, 1)      (MurmurHash3's finalizer, uint32 wrap-around)
  W_l[o, i] = (2 u(salt_l + o * fan_in + i) - 1) * sqrt(6 / fan_in)   (Kaiming-uniform range)
  b_l[o]    = (2 u(salt_l + 0x5bd1e995 + o) - 1) * 0.01,   salt_l = l * 0x9e3779b9
  x[n, i]   = 2 u(0x27d4eb2f + n * in_features + i) - 1,   y[n] = n % classes
computed in float64, rounded to float32.
One step = zero_grad, forward, loss, backward, SGD(lr, no momentum) update.

Standalone: prints one JSON line with the median/min step time (ms) over `reps`
repetitions of `steps` steps each (after `warmup` steps), and the losses of the
first `check_steps` steps so the C++ side can check both compute the same thing.

--serve (how bench/mlp_step.cc drives it, so that the two implementations take
turns on the CPU within one run): prints the setup JSON line (losses, version,
BLAS), then answers each stdin line "time K" with {"ms_per_step": ..., "loss": ...} (the
last step's loss) after running K steps, and "phases K" with the forward/backward/optimizer
split and the last step's loss, until "quit" or end of input.
Run with one thread: torch.set_num_threads(1) and OMP/OPENBLAS_NUM_THREADS=1.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

from bench_args import at_least

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402


def fmix32(k):
    k = k.astype(np.uint32)
    k ^= k >> np.uint32(16)
    k *= np.uint32(0x85EBCA6B)
    k ^= k >> np.uint32(13)
    k *= np.uint32(0xC2B2AE35)
    k ^= k >> np.uint32(16)
    return k


def uniform(keys):
    return fmix32(keys).astype(np.float64) / 4294967296.0


def formula_linear(fan_in, fan_out, layer):
    salt = np.uint32((layer * 0x9E3779B9) & 0xFFFFFFFF)
    keys = np.arange(fan_out * fan_in, dtype=np.uint64).astype(np.uint32) + salt
    w = (2 * uniform(keys) - 1) * math.sqrt(6.0 / fan_in)
    bkeys = np.arange(fan_out, dtype=np.uint32) + salt + np.uint32(0x5BD1E995)
    b = (2 * uniform(bkeys) - 1) * 0.01
    return w.reshape(fan_out, fan_in).astype(np.float32), b.astype(np.float32)


def loaded_blas():
    """The BLAS shared object this process actually mapped (Debian's alternatives decide)."""
    with open("/proc/self/maps") as maps:
        libs = sorted({line.split()[-1] for line in maps if "blas" in line.lower() and "/" in line})
    return ", ".join(libs) or "none mapped"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--in-features", type=at_least(1), default=784)
    p.add_argument("--width", type=at_least(1), default=1024)
    p.add_argument("--hidden", type=at_least(0), default=4)
    p.add_argument("--classes", type=at_least(1), default=10)
    p.add_argument("--batch", type=at_least(1), default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--warmup", type=at_least(0), default=5)
    p.add_argument("--steps", type=at_least(1), default=10)
    p.add_argument("--reps", type=at_least(1), default=5)
    p.add_argument("--check-steps", type=at_least(1), default=5)
    p.add_argument("--serve", action="store_true", help="answer 'time K' requests on stdin")
    a = p.parse_args()

    torch.set_num_threads(1)
    dims = [a.in_features] + [a.width] * a.hidden + [a.classes]
    layers = []
    for l in range(len(dims) - 1):
        lin = torch.nn.Linear(dims[l], dims[l + 1])
        w, b = formula_linear(dims[l], dims[l + 1], l)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w))
            lin.bias.copy_(torch.from_numpy(b))
        layers.append(lin)
        if l < len(dims) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    xkeys = np.arange(a.batch * a.in_features, dtype=np.uint32) + np.uint32(0x27D4EB2F)
    x = torch.from_numpy((2 * uniform(xkeys) - 1).reshape(a.batch, a.in_features).astype(np.float32))
    y = torch.arange(a.batch, dtype=torch.int64) % a.classes
    opt = torch.optim.SGD(model.parameters(), lr=a.lr)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    def phases(k):
        """ms per step spent in forward+loss, backward, and zero_grad+optimizer step, and
        the last step's loss (mlp_step checks it)."""
        fwd = bwd = opt_ms = 0.0
        for _ in range(k):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            t1 = time.perf_counter()
            loss = loss_fn(model(x), y)
            t2 = time.perf_counter()
            loss.backward()
            t3 = time.perf_counter()
            opt.step()
            t4 = time.perf_counter()
            fwd += t2 - t1
            bwd += t3 - t2
            opt_ms += (t1 - t0) + (t4 - t3)
        return {"forward_ms": fwd * 1e3 / k, "backward_ms": bwd * 1e3 / k, "optimizer_ms": opt_ms * 1e3 / k,
                "loss": float(loss.item())}

    losses = [float(step().item()) for _ in range(a.check_steps)]
    info = {"impl": "pytorch", "version": torch.__version__, "threads": torch.get_num_threads(),
            "blas": loaded_blas(), "losses": losses}
    if a.serve:
        print(json.dumps(info), flush=True)
        for line in sys.stdin:
            words = line.split()
            if not words or words[0] == "quit":
                break
            k = int(words[1])
            if words[0] == "phases":
                print(json.dumps(phases(k)), flush=True)
                continue
            t0 = time.perf_counter()
            for _ in range(k):
                loss = step()
            value = float(loss.item())
            print(json.dumps({"ms_per_step": (time.perf_counter() - t0) * 1e3 / k, "loss": value}), flush=True)
        return
    for _ in range(a.warmup):
        step()
    times = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        for _ in range(a.steps):
            loss = step()
        loss.item()
        times.append((time.perf_counter() - t0) * 1e3 / a.steps)
    info.update({"median_ms": statistics.median(times), "min_ms": min(times), "times_ms": times})
    print(json.dumps(info))


if __name__ == "__main__":
    main()
