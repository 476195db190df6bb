"""Train two models one after the other in one process, and watch the memory the first leaves behind.

    python examples/train.py                            # without gpureclaim: the cache stays until exit
    gpureclaim run -- python examples/train.py          # gpureclaim gives it back between the models
    gpureclaim run -- python examples/train.py --wait 30 &  then: gpureclaim release $!

Uses PyTorch on a GPU when it can; otherwise a small stand-in framework (examples/simframework.py) over the
CUDA runtime, which on a machine without a GPU is gpureclaim's simulator (LD_LIBRARY_PATH=build/sim).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
MiB = 1024 * 1024


def framework():
    try:
        import torch
        if torch.cuda.is_available():
            return "pytorch", torch
    except ImportError:
        pass
    import simframework
    return "stand-in (examples/simframework.py)", simframework


def train(name, fw_name, fw, steps, width):
    """A few steps of a model; returns when the model is gone (deleted by the program)."""
    if fw_name == "pytorch":
        torch = fw
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        for _ in range(steps):
            x = torch.randn(4096, width, device="cuda")
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        torch.cuda.synchronize()
        print("%s: trained, final loss %.4f" % (name, loss.item()))
        del model, opt, x, loss
    else:
        weights = [fw.Tensor(width * width * 4) for _ in range(8)]
        for _ in range(steps):
            activations = [fw.Tensor(4096 * width * 4) for _ in range(4)]
            del activations
        print("%s: trained (stand-in: allocations only)" % name)
        del weights


def reserved(fw_name, fw):
    return fw.cuda.memory_reserved() if fw_name == "pytorch" else fw.memory_reserved()


def free_memory(fw_name, fw):
    return (fw.cuda.mem_get_info() if fw_name == "pytorch" else fw.mem_get_info())[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--wait", type=float, default=0, help="seconds to wait for `gpureclaim release <pid>` between models")
    args = ap.parse_args()
    fw_name, fw = framework()
    try:
        import gpureclaim
        gpureclaim.version()
        under = bool(gpureclaim.enabled())
        state = "loaded" if under else "loaded but disabled (GPURECLAIM_DISABLE)"
    except Exception:
        under = False
        state = "not loaded"
    print("framework: %s; gpureclaim %s; pid %d" % (fw_name, state, os.getpid()))

    train("model 1", fw_name, fw, args.steps, args.width)
    left = reserved(fw_name, fw)
    print("after model 1: %.1f MiB still reserved by the framework, device free %.1f MiB"
          % (left / MiB, free_memory(fw_name, fw) / MiB))
    if under:
        if args.wait:
            print("waiting up to %.0fs: run `gpureclaim release %d`" % (args.wait, os.getpid()), flush=True)
            deadline = time.time() + args.wait
            while time.time() < deadline and reserved(fw_name, fw) == left:
                time.sleep(0.1)
        if reserved(fw_name, fw) == left:
            r = gpureclaim.release()
            print("gpureclaim.release(): %.1f MiB back (frameworks %.1f MiB, pools %.1f MiB) in %.1f ms"
                  % ((r["cached_bytes"] + r["orphaned_bytes"]) / MiB, r["framework_bytes"] / MiB,
                     r["pool_bytes"] / MiB, r["ms"]))
        print("after the release: %.1f MiB reserved, device free %.1f MiB"
              % (reserved(fw_name, fw) / MiB, free_memory(fw_name, fw) / MiB))
    else:
        print("(without gpureclaim that memory stays reserved until the process exits)")
    train("model 2", fw_name, fw, args.steps, args.width)
    return 0


if __name__ == "__main__":
    sys.exit(main())
