"""The Triton kernels compiled for real GPUs (sm_75, sm_80, sm_90) on a machine that has none.

The CPU tests run the kernels through Triton's interpreter, which accepts programs the GPU compiler
rejects (tl.dot shapes, dtype mixes, non-constexpr shapes) and says nothing about registers.  Here
the same launches the wrappers make (``kernels._attention_launches`` / ``_gather_launch`` /
``_offsets_launch``, built from CPU tensors) go through Triton's real CUDA pipeline — TTIR, TTGIR,
LLVM, PTX and ptxas to a cubin — for each target, with the ptxas and cuobjdump that ship inside the
triton wheel.  Nothing runs; the claims are that every configuration compiles, that the default
tile sizes need no register spills, and that K/V rows are read with 16-byte vector loads.

The compile runs in a subprocess with TRITON_INTERPRET=0 (this process already imported triton in
interpreter mode) and a fresh cache directory, so every kernel really is compiled.  It skips with
the reason when the toolchain is missing (no triton, no bundled ptxas, or a triton whose internal
compile API moved).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# (target sm, kind, dtype, Hq, Hkv, D, block size, num_splits): the matrix at its corners
CONFIGS = [
    (90, "paged", "bfloat16", 32, 8, 128, 16, 1),     # the benchmark's headline point (GQA 4)
    (90, "paged", "bfloat16", 32, 32, 128, 256, 4),   # MHA broadcast path, split-K + merge
    (90, "contiguous", "bfloat16", 32, 8, 128, 0, 1),
    (90, "gather", "bfloat16", 0, 8, 128, 16, 0),
    (80, "paged", "float16", 5, 1, 64, 8, 2),         # odd group (5 query heads on 1 KV head), split-K
    (80, "paged", "float32", 32, 4, 128, 32, 1),      # fp32: an FMA ("ieee") tl.dot, GQA 8
    (80, "student", "bfloat16", 32, 8, 128, 16, 1),   # token_offset_fn= recompiles with another helper
    (80, "gather", "float32", 0, 5, 64, 8, 0),        # a row that is not a power of two (masked columns)
    (80, "offsets", "int32", 0, 0, 0, 64, 0),
    (75, "paged", "float16", 32, 8, 128, 16, 1),      # T4: Triton lowers fp16 dots to FMAs before sm_80
    (75, "paged", "float16", 32, 32, 128, 16, 1),
]


def _toolchain_reason() -> str | None:
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return "triton is not installed"
    nvidia = Path(list(spec.submodule_search_locations)[0]) / "backends" / "nvidia"
    ptxas = os.environ.get("TRITON_PTXAS_PATH") or str(nvidia / "bin" / "ptxas")
    if not os.access(ptxas, os.X_OK):
        return f"no ptxas at {ptxas} (this triton wheel has no CUDA backend)"
    return None


pytestmark = pytest.mark.slow  # the compile matrix: a fresh triton compiles every configuration for three GPUs


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    reason = _toolchain_reason()
    if reason:
        pytest.skip(f"cannot compile for CUDA offline: {reason}")
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path_factory.mktemp("triton_cache")))
    run = subprocess.run([sys.executable, __file__], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    if "unavailable" in result:
        pytest.skip(f"cannot compile for CUDA offline: {result['unavailable']}")
    return result["kernels"]


def test_every_configuration_compiles_to_a_cubin(compiled):
    failures = [f"{k['config']}: {k['error']}" for k in compiled if k.get("error")]
    assert not failures, "\n".join(failures)
    names = {(k["config"][1], k["kernel"]) for k in compiled}
    assert ("paged", "_decode_attention_kernel") in names and ("paged", "_merge_splits_kernel") in names
    assert ("gather", "_paged_gather_kernel") in names and ("offsets", "_token_offset_probe_kernel") in names
    assert all(k["cubin_bytes"] > 0 for k in compiled)
    assert {k["config"][0] for k in compiled} == {75, 80, 90}


def test_default_tiles_need_no_register_spills(compiled):
    with_usage = [k for k in compiled if k.get("regs") is not None]
    if not with_usage:
        pytest.skip("cuobjdump is not available to read register usage")
    spilled = [f"{k['config']} {k['kernel']}: {k['regs']} registers, stack {k['stack']} B, local {k['local']} B"
               for k in with_usage if k["stack"] or k["local"]]
    assert not spilled, "\n".join(spilled)
    assert all(k["regs"] <= 255 for k in with_usage)


def test_kv_rows_are_read_with_16_byte_vector_loads(compiled):
    # A row's D values are contiguous and (block id * stride) keeps them 16-byte aligned, so the
    # compiler must be able to prove it: scalar loads here would cost several times the bandwidth.
    readers = [k for k in compiled if k["kernel"] in ("_decode_attention_kernel", "_paged_gather_kernel")]
    assert readers
    scalar = [f"{k['config']} {k['kernel']}" for k in readers if not k["vector_loads"]]
    assert not scalar, "no 16-byte loads in: " + ", ".join(scalar)


def test_gpu_check_matrix_in_parallel_processes_matches_one_process():
    # `bench gpu` spends its time compiling, so it checks slices of the matrix in spawned worker
    # processes; the slicing must not change a single figure (each configuration seeds itself).
    import torch

    import labsupport  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
    from labsupport.bench import kernel as KB

    configs = [(torch.float32, 8, 5, 1, 3), (torch.bfloat16, 16, 4, 2, 1)]
    kwargs = dict(configs=configs, head_dim=16, long_len=20, device="cpu")
    parallel = KB.correctness_matrix(workers=2, **kwargs)
    serial = KB.correctness_matrix(workers=1, **kwargs)
    assert parallel == serial
    assert [r["index"] for r in parallel] == [0, 1] and all(r["passed"] for r in parallel)
    assert [r["num_q_heads"] for r in parallel] == [5, 4]


# ------------------------------------------------------------------------------------------------
# The compile script (run as `python tests/test_kernels_compile.py` with TRITON_INTERPRET=0)
# ------------------------------------------------------------------------------------------------
VECTOR_LOAD = re.compile(r"ld\.global(\.[a-z]+)*\.v4\.b32|cp\.async\.cg\.shared\.global[^;]*0x10")


def _main() -> None:
    import tempfile

    import torch

    import labsupport  # noqa: F401
    from labsupport import kernel_args
    from labsupport import kernels as K

    try:
        import triton
        import triton.language as tl
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource, make_backend
        from triton.runtime.jit import create_function_from_signature
        if K._INTERPRETING:
            raise RuntimeError("triton was imported in interpreter mode")
        probe = K._decode_attention_kernel
        for name in ("signature", "params", "_pack_args"):
            getattr(probe, name)
    except Exception as exc:  # a triton whose internal compile API differs from 3.x's
        print(json.dumps({"unavailable": f"{type(exc).__name__}: {exc}"}))
        return
    globals()["tl"] = tl  # the student helper below resolves `tl` through this module's globals

    @triton.jit
    def student_token_offset(table_row, token, valid, BLOCK_SIZE: tl.constexpr, stride_block, stride_slot):
        # the same address, written the way a student might: slot number first, then elements
        block = tl.load(table_row + token // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        return (block * BLOCK_SIZE + token % BLOCK_SIZE) * stride_slot

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"

    def usage(cubin: bytes) -> dict:
        if not os.access(cuobjdump, os.X_OK):
            return {}
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin)
            f.flush()
            out = subprocess.run([str(cuobjdump), "--dump-resource-usage", f.name], capture_output=True,
                                 text=True).stdout
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", out)
        return dict(regs=int(m[1]), stack=int(m[2]), local=int(m[4])) if m else {}

    def compile_launch(launch, target):
        # what JITFunction.run does before it launches, minus the driver: bind and specialise the
        # arguments, then compile for `target` instead of the (absent) current device
        fn = launch.kernel
        backend = make_backend(target)
        binder = create_function_from_signature(fn.signature, fn.params, backend)
        bound, specialization, options = binder(*launch.args, **launch.kwargs)
        options, signature, constexprs, attrs = fn._pack_args(backend, launch.kwargs, bound, specialization, options)
        return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)

    def launches(sm, kind, dtype_name, hq, hkv, d, bs, splits):
        dtype = getattr(torch, dtype_name)
        batch, num_blocks = 2, 64
        lens = torch.ones(batch, dtype=torch.int32)
        table = torch.zeros(batch, 8, dtype=torch.int32)
        if kind == "gather":
            cache = torch.zeros(num_blocks, bs, hkv, d, dtype=dtype)
            return [K._gather_launch(cache, table, lens, torch.empty(batch, 8 * bs, hkv, d, dtype=dtype))]
        if kind == "offsets":
            out = torch.empty(batch, 8 * bs, dtype=torch.int64)
            return [K._offsets_launch(table, lens, out, bs, bs * 8 * 128, 8 * 128)]
        q = torch.zeros(batch, hq, d, dtype=dtype)
        if kind == "contiguous":
            k = torch.zeros(batch, 256, hkv, d, dtype=dtype)
            layout = kernel_args.Layout(batch, hkv, d, 256, batch, hq)
            return K._attention_launches(q, k, k, lens, lens, torch.empty_like(q), layout, d ** -0.5, splits,
                                         paged=False, capability=divmod(sm, 10))
        k = torch.zeros(num_blocks, bs, hkv, d, dtype=dtype)
        layout = kernel_args.Layout(batch, hkv, d, bs, num_blocks, hq)
        fn = student_token_offset if kind == "student" else None
        return K._attention_launches(q, k, k, table, lens, torch.empty_like(q), layout, d ** -0.5, splits,
                                     paged=True, token_offset_fn=fn, capability=divmod(sm, 10))

    kernels = []
    for config in CONFIGS:
        for launch in launches(*config):
            name = launch.kernel.fn.__name__
            row = dict(config=list(config), kernel=name, tile=launch.kwargs.get("TILE"))
            try:
                compiled = compile_launch(launch, GPUTarget("cuda", config[0], 32))
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc).strip()[-1500:]}"
            else:
                row.update(usage(compiled.asm["cubin"]), cubin_bytes=len(compiled.asm["cubin"]),
                           vector_loads=len(VECTOR_LOAD.findall(compiled.asm["ptx"])))
            kernels.append(row)
            print(row, file=sys.stderr, flush=True)
    print(json.dumps({"kernels": kernels}))


if __name__ == "__main__":
    _main()
