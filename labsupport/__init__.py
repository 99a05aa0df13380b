"""labsupport: the real mechanisms behind the paged KV-cache labs (Lecture 10, §10.1–§10.7).

Importing the package decides how Triton will run.  Triton reads TRITON_INTERPRET when it is
first imported, so on a machine without CUDA we set it here, before anything imports triton,
and the same kernels then run on CPU tensors through Triton's interpreter.  A value the user
already set is left alone.  Where no GPU can be present the decision needs no torch; where one may be,
torch.cuda makes it.
"""
from __future__ import annotations

import os
import sys

__version__ = "0.1.0"


# The device files a GPU that torch.cuda can use shows up as on Linux: NVIDIA's driver (also inside a container
# given a GPU), WSL 2's GPU, ROCm's (torch.cuda serves AMD GPUs too).
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg", "/dev/kfd")


def no_gpu_here() -> bool:
    """True where torch cannot find a CUDA GPU, known without importing torch (1.4 CPU-seconds of every kernel's
    start, and most of the library never needs torch): macOS, or Linux with no GPU's device file."""
    if sys.platform == "darwin":
        return True
    return sys.platform.startswith("linux") and not any(os.path.exists(p) for p in GPU_DEVICE_FILES)


def _configure_triton() -> None:
    if "TRITON_INTERPRET" in os.environ or "triton" in sys.modules:
        return
    if no_gpu_here():
        os.environ["TRITON_INTERPRET"] = "1"
        return
    try:  # a GPU may be here: torch decides
        import torch
    except ImportError:  # doctor reports the missing torch
        return
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


_configure_triton()
