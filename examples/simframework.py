"""A stand-in for PyTorch in train.py when PyTorch (or a GPU) is not available: a tiny "framework" with a
caching allocator over the CUDA runtime (libcudart.so.13, which on a machine without a GPU is gpureclaim's
simulator). Deleted tensors' memory stays in its cache, as in PyTorch; `empty_cache()` gives it back, and the
module takes part in gpureclaim's releases through `__gpureclaim_release__`. It computes nothing."""
import ctypes
import threading

_rt = ctypes.CDLL("libcudart.so.13")
_rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
_rt.cudaFree.argtypes = [ctypes.c_void_p]
_rt.cudaMemGetInfo.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
_rt.cudaGetErrorName.restype = ctypes.c_char_p
_CUDA_ERROR_MEMORY_ALLOCATION = 2


def _cuda_error(rc):
    """Out of memory is a MemoryError; anything else (no driver, no device) says what CUDA said, and what to do."""
    if rc == _CUDA_ERROR_MEMORY_ALLOCATION:
        return MemoryError("out of device memory")
    name = (_rt.cudaGetErrorName(rc) or b"error %d" % rc).decode()
    return RuntimeError("CUDA failed: %s (no NVIDIA driver or GPU? without one, run on gpureclaim's simulator: "
                        "LD_LIBRARY_PATH=build/sim)" % name)

_lock = threading.Lock()
_cache = {}  # size -> [pointers]
_live = 0


class Tensor:
    def __init__(self, nbytes):
        global _live
        with _lock:
            free = _cache.get(nbytes)
            if free:
                self.ptr = free.pop()
            else:
                p = ctypes.c_void_p()
                rc = _rt.cudaMalloc(ctypes.byref(p), nbytes)
                if rc != 0:
                    raise _cuda_error(rc)
                self.ptr = p.value
            self.nbytes = nbytes
            _live += nbytes

    def __del__(self):
        global _live
        if not hasattr(self, "ptr"):  # its allocation failed
            return
        with _lock:
            _cache.setdefault(self.nbytes, []).append(self.ptr)  # cached, not freed
            _live -= self.nbytes


def memory_allocated():
    return _live


def memory_reserved():
    with _lock:
        return _live + sum(n * len(ps) for n, ps in _cache.items())


def empty_cache():
    with _lock:
        for ptrs in _cache.values():
            for p in ptrs:
                _rt.cudaFree(ctypes.c_void_p(p))
        _cache.clear()


def mem_get_info():
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    _rt.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


def __gpureclaim_release__():
    before = memory_reserved()
    empty_cache()
    return before - memory_reserved()


def __gpureclaim_memory__():
    """What `gpureclaim ps` shows for this cache (as it does for torch.cuda.memory_stats()): reserved, in use,
    and what a release would give back (here all that is not in use)."""
    with _lock:
        cached = sum(n * len(ps) for n, ps in _cache.items())
        return {"device": 0, "reserved": _live + cached, "allocated": _live, "releasable": cached}
