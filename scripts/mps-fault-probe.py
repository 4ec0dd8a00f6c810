#!/usr/bin/env python3
"""What an MPS server does after a fatal fault, with no gpuring involved (docs/gpu.md, "MPS or
not"). Run on a GPU machine with the MPS daemon started (scripts/mps.sh); needs only libcuda.

    scripts/mps-fault-probe.py [LINGER_S]

One client faults (a kernel stores to an invalid address) while a bystander client runs small
work. The bystander sees its context lost and lingers LINGER_S seconds (default 8) before it
exits, as a faulted process that does not exit at once would. Meanwhile:

- `early`: a process that initialised CUDA before the fault but made no context, then tries to
  make one every 0.5 s in the same process;
- `retry`: a process started after the fault that tries cuInit (and then a context) every 0.5 s
  in the same process;
- `fresh`: a new process every 0.5 s that tries once;
- `idle`: a client with a context that makes no call until after the fault, then says which
  calls report the loss.

Each prints when it got a context, so the output says whether a process can wait for the
server in-process, or whether only a new process gets in, and how soon after the last faulted
client exits.
"""
import ctypes
import subprocess
import sys
import time

PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry bad(.param .u64 p)
{
  .reg .b64 %rd<2>;
  .reg .b32 %r<2>;
  ld.param.u64 %rd1, [p];
  mov.u32 %r1, 1;
  st.global.u32 [%rd1], %r1;
  ret;
}
"""
T0 = float(sys.argv[3]) if len(sys.argv) > 3 else time.time()


def say(role, what):
    print(f"{time.time() - T0:7.2f} s {role}: {what}", flush=True)


def cuda():
    lib = ctypes.CDLL("libcuda.so.1")
    return lib


def make_context(lib):
    """cuDevicePrimaryCtxRetain + a 1 MiB allocation: (code, call)."""
    dev = ctypes.c_int()
    r = lib.cuDeviceGet(ctypes.byref(dev), 0)
    if r:
        return r, "cuDeviceGet"
    ctx = ctypes.c_void_p()
    r = lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    if r:
        return r, "cuDevicePrimaryCtxRetain"
    r = lib.cuCtxSetCurrent(ctx)
    if r:
        return r, "cuCtxSetCurrent"
    ptr = ctypes.c_uint64()
    r = lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 20))
    if r:
        lib.cuDevicePrimaryCtxRelease_v2(dev)
        return r, "cuMemAlloc"
    return 0, "ok"


def crasher():
    lib = cuda()
    assert lib.cuInit(0) == 0 and make_context(lib)[0] == 0
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    assert lib.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(PTX)) == 0
    assert lib.cuModuleGetFunction(ctypes.byref(fn), mod, b"bad") == 0
    addr = ctypes.c_uint64(0x10)
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(addr), ctypes.c_void_p))
    say("crasher", "launching a store to address 0x10")
    r = lib.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, None, params, None)
    s = lib.cuCtxSynchronize()
    # Which calls report the sticky error: what a probe for the loss can use.
    ev = ctypes.c_void_p()
    created = lib.cuEventCreate(ctypes.byref(ev), 2)  # CU_EVENT_DISABLE_TIMING
    queried = lib.cuEventQuery(ev) if created == 0 else "-"
    say("crasher", f"launch {r}, synchronize {s}; then cuEventCreate {created}, "
        f"cuEventQuery {queried}, cuStreamQuery(0) {lib.cuStreamQuery(None)}: exiting")


def bystander(linger):
    lib = cuda()
    assert lib.cuInit(0) == 0 and make_context(lib)[0] == 0
    ptr = ctypes.c_uint64()
    assert lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 20)) == 0
    say("bystander", "running")
    while True:
        r = lib.cuMemsetD32_v2(ptr, 7, 1 << 18) or lib.cuCtxSynchronize()
        if r:
            say("bystander", f"context lost (code {r}); lingering {linger} s")
            time.sleep(linger)
            say("bystander", "exiting")
            return
        time.sleep(0.005)


def idle():
    """A client with a context that makes no call until after the fault: which calls tell it
    that its context is lost (what gpuring's probe of an idle process relies on)."""
    lib = cuda()
    assert lib.cuInit(0) == 0 and make_context(lib)[0] == 0
    say("idle", "has a context; waiting")
    sys.stdin.readline()  # the fault happened
    time.sleep(0.2)
    ev = ctypes.c_void_p()
    created = lib.cuEventCreate(ctypes.byref(ev), 2)  # CU_EVENT_DISABLE_TIMING
    queried = lib.cuEventQuery(ev) if created == 0 else "-"
    st = ctypes.c_void_p()
    made = lib.cuStreamCreate(ctypes.byref(st), 1)  # CU_STREAM_NON_BLOCKING
    squery = lib.cuStreamQuery(st) if made == 0 else "-"
    say("idle", f"cuEventCreate {created}, cuEventQuery {queried}, cuStreamCreate {made}, "
        f"cuStreamQuery(own) {squery}, cuStreamQuery(0) {lib.cuStreamQuery(None)}; exiting")


def early():
    lib = cuda()
    say("early", f"cuInit {lib.cuInit(0)} before the fault")
    sys.stdin.readline()  # the fault happened
    trying(lib, "early", init=False)


def retry():
    trying(cuda(), "retry", init=True)


def trying(lib, role, init):
    first = None
    start = time.time()
    while time.time() - start < 40:
        t = time.time()
        r, call = (lib.cuInit(0), "cuInit") if init else (0, "")
        if r == 0:
            r, call = make_context(lib)
        took = time.time() - t
        if r == 0:
            say(role, f"got a context in-process after {time.time() - start:.1f} s")
            return
        if first != (r, call):
            say(role, f"{call} -> {r} (took {took:.2f} s)")
            first = (r, call)
        time.sleep(0.5)
    say(role, "gave up after 40 s")


def once():
    lib = cuda()
    r = lib.cuInit(0)
    r, call = (r, "cuInit") if r else make_context(lib)
    print(f"{r} {call}", flush=True)


def main():
    linger = float(sys.argv[1]) if len(sys.argv) > 1 else 8.0
    me = [sys.executable, __file__]
    by = subprocess.Popen(me + ["x", "bystander", str(T0), str(linger)])
    ea = subprocess.Popen(me + ["x", "early", str(T0)], stdin=subprocess.PIPE, text=True)
    quiet = subprocess.Popen(me + ["x", "idle", str(T0)], stdin=subprocess.PIPE, text=True)
    time.sleep(3)
    subprocess.run(me + ["x", "crasher", str(T0)])
    for p in (ea, quiet):
        p.stdin.write("go\n")
        p.stdin.flush()
    re = subprocess.Popen(me + ["x", "retry", str(T0)])
    got = None
    start = time.time()
    while time.time() - start < 60:
        out = subprocess.run(me + ["x", "once", str(T0)], capture_output=True, text=True).stdout
        code = out.split()[0] if out.split() else "?"
        if got != code:
            say("fresh", f"a new process: {out.strip()}")
            got = code
        if code == "0":
            break
        time.sleep(0.5)
    for p in (by, ea, re, quiet):
        try:
            p.wait(timeout=50)
        except subprocess.TimeoutExpired:
            p.kill()
    say("probe", "done")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "x":
        role = sys.argv[2]
        if role == "bystander":
            bystander(float(sys.argv[4]))
        else:
            roles = {"crasher": crasher, "early": early, "idle": idle, "retry": retry, "once": once}
            roles[role]()
    else:
        main()
