"""A small PyTorch training loop, deterministic, that prints its checksum.

Run plainly it uses PyTorch's caching allocator; with --stensor it routes
every tensor through libstensor.so's pluggable-allocator pair with the
stensor package (stensor.torch.use_allocator(); the library must be
preloaded: LD_PRELOAD), so a cap (STENSOR_MEMORY_LIMIT) swaps tensors, and
prints a counter read with stensor.stats(). The checksum is the SHA-256 of every parameter's bytes after the
last step: runs that differ in one bit differ in it.

usage: torch_check.py [--stensor] [--steps N] [--hidden N] [--layers N] [--batch N]
"""
import argparse
import hashlib
import os
import sys
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--stensor", action="store_true")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=1024)
    a = p.parse_args()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    stensor = None
    if a.stensor:
        # The stensor package in the GPU bundle (python/ beside this file) or
        # the source tree (python/ two folders up), else an installed one.
        here = os.path.dirname(os.path.abspath(__file__))
        for d in (os.path.join(here, "..", "..", "python"), os.path.join(here, "python")):
            sys.path.insert(0, os.path.normpath(d))
        import stensor
        import stensor.torch

        stensor.torch.use_allocator()
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    dev = torch.device("cuda")
    layers = []
    for _ in range(a.layers):
        layers += [torch.nn.Linear(a.hidden, a.hidden), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(a.hidden, 10)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    gen = torch.Generator(device="cpu").manual_seed(1)
    start = time.time()
    for _ in range(a.steps):
        x = torch.randn(a.batch, a.hidden, generator=gen).to(dev)
        y = torch.randint(0, 10, (a.batch,), generator=gen).to(dev)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    wall = time.time() - start
    h = hashlib.sha256()
    for t in model.parameters():
        h.update(t.detach().cpu().numpy().tobytes())
    print(f"loss {loss.item():.6f}")
    print(f"steps_per_s {a.steps / wall:.3f}")
    print(f"max_reserved_bytes {torch.cuda.max_memory_reserved() if not a.stensor else 0}")
    if stensor is not None:
        counters = stensor.stats()
        print(f"stensor_swap_ins {counters.get('swap_ins', 0)}")
    print(f"checksum {h.hexdigest()[:16]}")


if __name__ == "__main__":
    main()
