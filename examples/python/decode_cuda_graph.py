"""A decode loop in PyTorch that writes each layer's K/V through kvhal inside a CUDA graph (torch.cuda.graph), the
capture holding the process's first kvhal call, and checks every step against torch indexing. Without CUDA it
runs the same loop eagerly on the CPU and says so.

usage: decode_cuda_graph.py [--layers 32] [--steps 20] [--batch 64]"""
import argparse
import sys

import torch

import kvhal


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    heads, dim, block, blocks = 8, 128, 16, 256
    dt = torch.float16 if cuda else torch.float32
    kc = [torch.zeros(blocks, block, heads, dim, dtype=dt, device=dev) for _ in range(a.layers)]
    vc = [torch.zeros_like(c) for c in kc]
    k = torch.zeros(a.layers, a.batch, heads, dim, dtype=dt, device=dev)  # static inputs the graph reads
    v = torch.zeros_like(k)
    slots = torch.zeros(a.batch, dtype=torch.int64, device=dev)

    def step(stream):
        for layer in range(a.layers):
            kvhal.paged_caching(kc[layer], vc[layer], k[layer], v[layer], slots, stream=stream)

    if cuda:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):  # the first kvhal call of this process happens here
            step(torch.cuda.current_stream())
        run = g.replay
        print(f"captured {a.layers} layers of paged_caching into one CUDA graph on {torch.cuda.get_device_name()}")
    else:
        run = lambda: step(None)  # noqa: E731
        print("no CUDA: running the same loop eagerly on the CPU (no graph)")
    ref_k = [torch.zeros_like(c).view(-1, heads, dim) for c in kc]
    ref_v = [torch.zeros_like(c).view(-1, heads, dim) for c in vc]
    gen = torch.Generator(device="cpu").manual_seed(14)
    for s in range(a.steps):
        new_slots = torch.randperm(blocks * block, generator=gen)[: a.batch]
        new_slots[s % a.batch] = -1  # a padding token
        slots.copy_(new_slots.to(dev))
        k.copy_(torch.randn(k.shape, generator=gen).to(dt))
        v.copy_(torch.randn(v.shape, generator=gen).to(dt))
        run()
        if cuda:
            torch.cuda.synchronize()
            kvhal.check_errors("cuda:%d" % torch.cuda.current_device())
        keep = (new_slots >= 0).to(dev)
        dst = new_slots.to(dev)[keep]
        for layer in range(a.layers):
            ref_k[layer][dst] = k[layer][keep]
            ref_v[layer][dst] = v[layer][keep]
            if not (torch.equal(kc[layer].view(-1, heads, dim), ref_k[layer]) and
                    torch.equal(vc[layer].view(-1, heads, dim), ref_v[layer])):
                print(f"decode_cuda_graph: error: step {s} layer {layer} differs from torch indexing", file=sys.stderr)
                return 1
    print(f"{a.steps} steps x {a.layers} layers: every step bit-exact with torch indexing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
