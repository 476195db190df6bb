"""A stand-in for PyTorch in the simulator tests: a caching allocator over the (simulated) CUDA runtime.

Deleted "tensors" go to a cache, as with PyTorch's caching allocator; only torch.cuda.empty_cache() gives the
memory back. gpureclaim's CPython releaser calls exactly the functions below, from its own thread.
"""
import ctypes
import threading

_rt = ctypes.CDLL("libcudart.so.13")
_rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
_rt.cudaFree.argtypes = [ctypes.c_void_p]


class _Cuda:
    def __init__(self):
        self._lock = threading.Lock()
        self._initialized = False
        self._cached = []  # (pointer, size)
        self._live = {}
        self.empty_cache_calls = 0
        self.empty_cache_threads = set()

    def is_initialized(self):
        return self._initialized

    def device_count(self):
        return 1

    def memory_reserved(self, device=0):
        with self._lock:
            return sum(n for _, n in self._cached) + sum(self._live.values())

    def empty_cache(self):
        with self._lock:
            self.empty_cache_calls += 1
            self.empty_cache_threads.add(threading.get_ident())
            for p, _ in self._cached:
                if _rt.cudaFree(ctypes.c_void_p(p)) != 0:
                    raise RuntimeError("cudaFree failed")
            self._cached = []

    def alloc(self, n):
        p = ctypes.c_void_p()
        if _rt.cudaMalloc(ctypes.byref(p), n) != 0:
            raise MemoryError("cudaMalloc failed")
        with self._lock:
            self._initialized = True
            self._live[p.value] = n
        return p.value

    def free(self, p):
        with self._lock:
            self._cached.append((p, self._live.pop(p)))


cuda = _Cuda()
