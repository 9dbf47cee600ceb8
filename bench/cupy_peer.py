"""Peer baseline for bench_swap: CuPy RawModule compile + get_function + first
launch of the same CUDA C source, cold (new source each time) and cached
(same source again). Run by bench/run.sh with the path of bench_swap, which
prints the source, so both measure identical code."""
import os
import statistics
import subprocess
import sys
import tempfile
import time

try:
    import cupy as cp
except ImportError as e:
    print("SKIP cupy_peer: CuPy not importable (%s)" % e)
    sys.exit(0)

src = subprocess.run([sys.argv[1], "--source"], capture_output=True, text=True,
                     check=True).stdout
os.environ["CUPY_CACHE_DIR"] = tempfile.mkdtemp(prefix="hk-cupy-cache-")
n = 1 << 16
x = cp.zeros(n, dtype=cp.float32)
cp.cuda.Device().synchronize()


def once(code):
    t0 = time.perf_counter()
    mod = cp.RawModule(code=code)
    f = mod.get_function("k0")
    f(((n + 255) // 256,), (256,), (x, cp.int32(n)))
    cp.cuda.Device().synchronize()
    return (time.perf_counter() - t0) * 1e3


pid = os.getpid()
first = once(src + "// cupy first %d\n" % pid)
miss = sorted(once(src + "// cupy miss %d %d\n" % (pid, i)) for i in range(15))
once(src + "// cupy hit %d\n" % pid)
hit = sorted(once(src + "// cupy hit %d\n" % pid) for _ in range(15))
print("== cupy_peer (CuPy %s)" % cp.__version__)
print("  cupy RawModule first compile+launch in process    %8.3f ms" % first)
print("  cupy RawModule(new source)+get_function+launch   median %8.3f ms  (min %.3f, max %.3f)"
      % (statistics.median(miss), miss[0], miss[-1]))
print("  cupy RawModule(same source)+get_function+launch  median %8.3f ms  (min %.3f, max %.3f)"
      % (statistics.median(hit), hit[0], hit[-1]))
