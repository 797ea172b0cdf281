"""Shared fixtures: the devices the tests run on (every present CPU and OpenCL device, CUDA with torch on GPUs)."""
import os

import numpy as np
import pytest

import kvhal

torch = None
try:
    import torch  # noqa: F811
except ImportError:  # NumPy-only runs
    pass

DEVICES = [d["device"] for d in kvhal.devices()]
if os.environ.get("KVHAL_PY_DEVICES"):
    DEVICES = [d for d in DEVICES if d.split(":")[0] in os.environ["KVHAL_PY_DEVICES"].split(",")]


def host_reference_paged(k_cache, v_cache, k, v, slots):
    """The plain host reference: token t goes to the flat slot slots[t] (skipped when negative)."""
    nb, bs = k_cache.shape[0], k_cache.shape[1]
    kf = k_cache.reshape(nb * bs, *k_cache.shape[2:])
    vf = v_cache.reshape(nb * bs, *v_cache.shape[2:])
    for t, s in enumerate(slots.reshape(-1)):
        if s >= 0:
            kf[s] = k.reshape(-1, *k.shape[-2:])[t]
            vf[s] = v.reshape(-1, *v.shape[-2:])[t]
    return kf.reshape(k_cache.shape), vf.reshape(v_cache.shape)


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param
