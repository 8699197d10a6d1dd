"""Question: What does each step of an eager call's prepared path cost on the host?

Where the host time of an eager samattn call goes: each step of the prepared path of
samattn.softmax (f32 64x1024) and of a decode-shaped flash_attn_func (bf16, sq1 sk512 h32
d128), timed alone, next to torch's call; the GQA decode step (sq1 sk1024 h32 hk8) whole;
and a torch.profiler listing of each call's kernels. One JSON file, $OUT/host_parts.json.

    SAMATTN_LIBRARY=/path/to/libsamattn.so python benchmarks/profiling/host_parts.py
"""

import ctypes
import json
import os

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import samattn
from samattn import _checks, _cuda, _eager, _family, _lib, _prepared
from samattn.bench.timing import graph_gpu_us, host_us_alternating, queued_gpu_us


def measure(cases, calls=200, rounds=15):
    times = host_us_alternating(cases, calls, rounds, warmup=20)
    return {k: round(v, 2) for k, v in times.items()}


L = _lib.lib()
x = torch.randn(64, 1024, device="cuda")
y = torch.empty_like(x)
samattn.softmax(x, -1)
key = _cuda._softmax_key(x, -1)
entry = _cuda._SOFTMAX.get(key)
args = _cuda._SOFTMAX.args(entry)
args.x, args.out, args.stream = x.data_ptr(), y.data_ptr(), _cuda._stream(x)
fam = ctypes.c_int32()
fwd = L.samattn_softmax_forward
abi = L.samattn_abi_version
ref, famref = ctypes.byref(args), ctypes.byref(fam)
raw_abi = ctypes.CDLL(_lib.library_path()).samattn_abi_version
# What a prepared softmax calls: the kept struct's address and the call's pointers.
with_pointers = _cuda._SOFTMAX.with_pointers
xp, yp, stream = x.data_ptr(), y.data_ptr(), _cuda._stream(x)


def fill():
    a = _cuda._SOFTMAX.args(entry)
    a.x, a.out, a.stream = x.data_ptr(), y.data_ptr(), _cuda._stream(x)


softmax = {
    "samattn.softmax": lambda: samattn.softmax(x, -1),
    "torch.softmax": lambda: torch.softmax(x, -1),
    "_cuda.softmax (no route)": lambda: _cuda.softmax(x, -1),
    "route": lambda: _eager.route(x),
    "key": lambda: _cuda._softmax_key(x, -1),
    "key+get": lambda: _cuda._SOFTMAX.get(_cuda._softmax_key(x, -1)),
    "empty_like": lambda: torch.empty_like(x),
    "args copy": lambda: _cuda._SOFTMAX.args(entry),
    "args copy+fill": fill,
    "stream": lambda: _cuda._stream(x),
    "data_ptr": lambda: x.data_ptr(),
    "Calls.run (struct copied in Python)": lambda: _cuda._SOFTMAX.run(key, entry, args, x),
    "raw C call (launch)": lambda: fwd(ref, famref),
    "with_pointers C call (the prepared path)": lambda: with_pointers(
        entry.address, xp, None, yp, stream, famref
    ),
    "ctypes abi_version (argtypes)": lambda: abi(),
    "ctypes abi_version (no argtypes)": lambda: raw_abi(),
    "set_last_family": lambda: _lib.set_last_family(80),
    "torch y.zero_()": lambda: y.zero_(),
    "torch.neg(x, out=y)": lambda: torch.neg(x, out=y),
    "requested_family": lambda: _family.requested_family(),
}
out = {"softmax_f32_64x1024": measure(softmax)}

bf16 = dict(device="cuda", dtype=torch.bfloat16)
qd, kd = torch.randn(1, 1, 32, 128, **bf16), torch.randn(1, 512, 32, 128, **bf16)
vd = torch.randn_like(kd)
qt, kt, vt = (t.transpose(1, 2) for t in (qd, kd, vd))
samattn.flash_attn_func(qd, kd, vd)
params = _checks.AttentionParams(128**-0.5, False, -1, -1, 0.0)
pointers = (qd.data_ptr(), kd.data_ptr(), vd.data_ptr())
akey = _cuda._attention_key(qd, kd, vd, params, pointers)
aentry = _cuda._ATTENTION.get(akey)
print(
    "decode entry",
    aentry is not None,
    aentry.workspace if aentry else None,
    samattn.last_family() if hasattr(samattn, "last_family") else None,
)
aargs = _cuda._ATTENTION.args(aentry)
od = torch.empty_like(qd)
aargs.q, aargs.k, aargs.v, aargs.o, aargs.stream = (
    qd.data_ptr(),
    kd.data_ptr(),
    vd.data_ptr(),
    od.data_ptr(),
    _cuda._stream(qd),
)
aargs.lse = None
ws = torch.empty(aentry.workspace, dtype=torch.uint8, device="cuda")
aargs2 = _cuda._ATTENTION.args(aentry)
ctypes.memmove(ctypes.addressof(aargs2), ctypes.addressof(aargs), ctypes.sizeof(aargs))
if aentry.workspace:
    aargs2.workspace, aargs2.workspace_bytes = ws.data_ptr(), aentry.workspace
afwd = L.samattn_attention_forward
aref = ctypes.byref(aargs2)
decode = {
    "samattn.flash_attn_func": lambda: samattn.flash_attn_func(qd, kd, vd),
    "sdpa": lambda: F.scaled_dot_product_attention(qt, kt, vt),
    "_cuda.flash_attn_forward": lambda: _cuda.flash_attn_forward(
        qd, kd, vd, params, want_lse=False
    ),
    "route(8)": lambda: _eager.route(qd, kd, vd, None, None, None, None, None),
    "attention_params": lambda: _checks.attention_params("x", None, False, (-1, -1), 0.0, 128),
    "attention_key": lambda: _cuda._attention_key(qd, kd, vd, params, pointers),
    "empty_like(q)": lambda: torch.empty_like(qd),
    "Calls.run": lambda: _cuda._ATTENTION.run(akey, aentry, aargs, qd),
    "raw C call (launch, workspace given)": lambda: afwd(aref, famref),
    "workspace empty": lambda: _prepared.empty(qd, aentry.workspace, torch.uint8),
}
out["decode_bf16_sk512_h32_d128"] = measure(decode)
qg, kg = torch.randn(1, 1, 32, 128, **bf16), torch.randn(1, 1024, 8, 128, **bf16)
vg = torch.randn_like(kg)
qgt, kgt, vgt = (t.transpose(1, 2) for t in (qg, kg, vg))
samattn.flash_attn_func(qg, kg, vg)
print(
    "gqa decode family",
    samattn.last_family() if hasattr(samattn, "last_family") else _lib.last_family(),
)
gqa = {
    "samattn.flash_attn_func": lambda: samattn.flash_attn_func(qg, kg, vg),
    "sdpa (enable_gqa)": lambda: F.scaled_dot_product_attention(qgt, kgt, vgt, enable_gqa=True),
}
out["decode_gqa_bf16_sk1024_h32_hk8_d128"] = measure(gqa)

# Each decode step with the family samattn picks and with sm80 forced: host us per eager
# call, and GPU us per call queued back to back and replayed from a CUDA graph.
steps = {
    "mha sk512 h32": (lambda: samattn.flash_attn_func(qd, kd, vd), decode["sdpa"]),
    "gqa sk1024 h32 hk8": (gqa["samattn.flash_attn_func"], gqa["sdpa (enable_gqa)"]),
}
families = {}
for name, (ours, theirs) in steps.items():
    for family in (None, "sm80"):
        with samattn.use_family(family):
            ours()
            ran = _lib.last_family()
            families[f"{name} {family or 'auto'}"] = {
                "family": ran,
                "host_us": measure({"x": ours})["x"],
                "queued_gpu_us": queued_gpu_us(ours),
                "graph_gpu_us": graph_gpu_us(ours),
            }
    families[f"{name} sdpa"] = {
        "host_us": measure({"x": theirs})["x"],
        "queued_gpu_us": queued_gpu_us(theirs),
        "graph_gpu_us": graph_gpu_us(theirs),
    }
out["decode_steps_by_family"] = families
print(json.dumps(families, indent=1))
print(json.dumps(out, indent=1))


for name, fn in (
    ("samattn", decode["samattn.flash_attn_func"]),
    ("sdpa", decode["sdpa"]),
    ("softmax", softmax["samattn.softmax"]),
    ("torch.softmax", softmax["torch.softmax"]),
):
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as p:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    ev = [
        (e.key, e.count, round(e.device_time_total / max(e.count, 1), 2))
        for e in p.key_averages()
        if e.device_time_total > 0 or "cuda" in e.key.lower()
    ]
    out["profile_" + name] = ev[:12]
print(json.dumps(out, indent=1))
with open(os.environ.get("OUT", ".") + "/host_parts.json", "w") as f:
    json.dump(out, f, indent=1)
