"""labsupport: the real mechanisms behind the paged KV-cache labs (Lecture 10, §10.1–§10.7).

Importing the package decides how Triton will run.  Triton reads TRITON_INTERPRET when it is
first imported, so on a machine without CUDA we set it here, before anything imports triton,
and the same kernels then run on CPU tensors through Triton's interpreter.  A value the user
already set is left alone.
"""
from __future__ import annotations

import os
import sys

__version__ = "0.1.0"


def _configure_triton() -> None:
    if "TRITON_INTERPRET" in os.environ or "triton" in sys.modules:
        return
    try:
        import torch
    except ImportError:  # doctor reports the missing torch
        return
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


_configure_triton()
