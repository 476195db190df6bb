"""A stand-in for PyTorch's pinned host memory cache (its CachingHostAllocator), for test_command.py: pinned
host blocks (cudaHostAlloc, on the simulator) that a "freed" tensor leaves cached, which only
torch._C._host_emptyCache() gives back. The device side is empty: torch.cuda holds nothing."""
import ctypes

_rt = ctypes.CDLL("libcudart.so.13")
_rt.cudaHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
_rt.cudaFreeHost.argtypes = [ctypes.c_void_p]


class _Cuda:
    def is_initialized(self):
        return True

    def device_count(self):
        return 1

    def memory_reserved(self, device=0):
        return 0

    def empty_cache(self):
        pass


class _C:
    host_cached = []  # pinned blocks kept for reuse
    empty_calls = 0

    @staticmethod
    def _host_emptyCache():
        _C.empty_calls += 1
        for p in _C.host_cached:
            if _rt.cudaFreeHost(ctypes.c_void_p(p)) != 0:
                raise RuntimeError("cudaFreeHost failed")
        _C.host_cached = []


def pin_and_cache(n):
    """A pinned host block of n bytes, allocated and "freed" into the cache, as a pinned tensor's is."""
    p = ctypes.c_void_p()
    if _rt.cudaHostAlloc(ctypes.byref(p), n, 0) != 0:
        raise MemoryError("cudaHostAlloc failed")
    _C.host_cached.append(p.value)


cuda = _Cuda()
