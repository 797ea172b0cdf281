#!/bin/bash
# Issue 14 on two GPUs (a 2-GPU kind): kvhal never moves the caller's current device. torch.cuda.set_device(0), then
# kvhal calls on cuda:1 (paged_caching, tensor_copy, copy_blocks, synchronize, check_errors, Stream) from Python:
# torch's current device must still be 0 after each, and new tensors land on cuda:0. Logs in $OUT.
set -uo pipefail
source .devdeps/env.sh
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
nvidia-smi -L > "$OUT/gpu.txt" 2>&1
B=/tmp/bpy2
meson setup $B -Dbackends=cpu,cuda -Dnvcc_arch=90 -Dpython=enabled -Dtests=false > "$OUT/build.txt" 2>&1 &&
  ninja -C $B >> "$OUT/build.txt" 2>&1 || { echo BUILD FAILED; tail -40 "$OUT/build.txt"; exit 1; }
export KVHAL_BACKEND_PATH=$B/backends PYTHONPATH=$B/python
python3 - > "$OUT/device-restore.txt" 2>&1 <<'PY'
import torch, kvhal
assert torch.cuda.device_count() >= 2, "needs two GPUs"
torch.cuda.set_device(0)
d = "cuda:1"
kc = torch.zeros(8, 16, 8, 128, dtype=torch.float16, device=d)
vc = torch.zeros_like(kc)
k = torch.randn(4, 8, 128, device=d).half()
s = torch.tensor([0, 17, 33, 100], device=d)
steps = [
    ("paged_caching", lambda: kvhal.paged_caching(kc, vc, k, k, s)),
    ("paged_caching on cuda:1's stream", lambda: kvhal.paged_caching(kc, vc, k, k, s, stream=torch.cuda.current_stream(1))),
    ("tensor_copy", lambda: kvhal.tensor_copy(vc, kc)),
    ("copy_blocks", lambda: kvhal.copy_blocks([kc, vc], [(0, 1)])),
    ("synchronize", lambda: kvhal.synchronize(d)),
    ("check_errors", lambda: kvhal.check_errors(d)),
    ("Stream", lambda: kvhal.Stream(d, torch.cuda.Stream(device=1)).check_errors()),
    ("empty", lambda: kvhal.empty((4,), "f32", d)),
]
for name, fn in steps:
    fn()
    cur = torch.cuda.current_device()
    assert cur == 0, f"{name}: torch's current device moved to {cur}"
    assert torch.empty(1, device="cuda").device.index == 0
    print("kept cuda:0 after", name)
ek = torch.zeros_like(kc).view(-1, 8, 128); ek[s] = k
assert torch.equal(kc.view(-1, 8, 128), ek)
print("device restore: OK")
PY
rc=$?
cat "$OUT/device-restore.txt"
exit $rc
