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
# kvhal's own tensors on cuda:1, filled from host arrays: PyTorch (2.x) refuses to export a CUDA tensor through
# DLPack while another device is its current one ("Can't export tensors on a different CUDA device index"), so
# torch tensors on cuda:1 cannot be handed over with torch's current device 0, which is the case under test
import numpy as np
kc = kvhal.empty((8, 16, 8, 128), "f16", d); kc.copy_from(np.zeros((8, 16, 8, 128), np.float16))
vc = kvhal.empty((8, 16, 8, 128), "f16", d); vc.copy_from(np.zeros((8, 16, 8, 128), np.float16))
k = kvhal.empty((4, 8, 128), "f16", d); k.copy_from(np.random.default_rng(1).standard_normal((4, 8, 128)).astype(np.float16))
s = kvhal.empty((4,), "i64", d); s.copy_from(np.array([0, 17, 33, 100], np.int64))
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
got = np.empty((8, 16, 8, 128), np.float16); kc.copy_to(got)
hk = np.empty((4, 8, 128), np.float16); k.copy_to(hk)
ek = np.zeros((8 * 16, 8, 128), np.float16); ek[[0, 17, 33, 100]] = hk
ek = ek.reshape(8, 16, 8, 128); ek[1] = ek[0]  # copy_blocks (0 -> 1) after the writes
assert np.array_equal(got, ek), "cuda:1 cache contents differ from the host reference"
print("device restore: OK")
PY
rc=$?
cat "$OUT/device-restore.txt"
exit $rc
