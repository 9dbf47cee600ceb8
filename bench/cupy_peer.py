"""Peer baseline for bench_swap: CuPy RawModule compile + get_function + first
launch of the same CUDA C sources, cold (a new source each time: a changed
constant in the code, as bench_swap does, never a comment) and cached (the
same source again). Run by bench/run.sh with the path of bench_swap, which
prints the source formats, so both measure identical code."""
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


def source_fmt(kind):
    return subprocess.run([sys.argv[1], "--source-fmt", kind], capture_output=True, text=True,
                          check=True).stdout


small = source_fmt("small")
tiny = source_fmt("tiny")
cub = source_fmt("cub")
cuda = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
# cub and cuda::std need the toolkit's headers; RawModule is given them as a
# program without hotkern would.
cub_options = ("-I%s/include" % cuda, "-I%s/include/cccl" % cuda, "--std=c++17")
os.environ["CUPY_CACHE_DIR"] = tempfile.mkdtemp(prefix="hk-cupy-cache-")
n = 1 << 16
x = cp.zeros(n, dtype=cp.float32)
cp.cuda.Device().synchronize()
pid = os.getpid()
serial = [0]


def variant(fmt, tag):
    """fmt with a constant no earlier run has compiled (the code changes)."""
    serial[0] += 1
    return fmt.replace("%d", str((pid % 20000) * 1000 + tag * 100 + serial[0]))


def once(code, options=()):
    t0 = time.perf_counter()
    mod = cp.RawModule(code=code, options=options)
    f = mod.get_function("k0")
    f(((n + 255) // 256,), (256,), (x, cp.int32(n)))
    cp.cuda.Device().synchronize()
    return (time.perf_counter() - t0) * 1e3


first = once(variant(small, 1))
miss = sorted(once(variant(small, 2)) for _ in range(15))
same = variant(small, 3)
once(same)
hit = sorted(once(same) for _ in range(15))
once(variant(tiny, 6))
tiny_miss = sorted(once(variant(tiny, 7)) for _ in range(15))
once(variant(cub, 4), cub_options)
cub_miss = sorted(once(variant(cub, 5), cub_options) for _ in range(7))
print("== cupy_peer (CuPy %s)" % cp.__version__)
print("  cupy RawModule first compile+launch in process    %8.3f ms" % first)
print("  cupy RawModule(new source)+get_function+launch   median %8.3f ms  (min %.3f, max %.3f)"
      % (statistics.median(miss), miss[0], miss[-1]))
print("  cupy RawModule(same source)+get_function+launch  median %8.3f ms  (min %.3f, max %.3f)"
      % (statistics.median(hit), hit[0], hit[-1]))
print("  cupy RawModule(one-line kernel, new source)+launch median %8.3f ms  (min %.3f, max %.3f)"
      % (statistics.median(tiny_miss), tiny_miss[0], tiny_miss[-1]))
print("  cupy RawModule(cub kernel, new source)+launch    median %8.3f ms  (min %.3f, max %.3f)"
      % (statistics.median(cub_miss), cub_miss[0], cub_miss[-1]))
