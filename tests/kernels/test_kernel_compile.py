"""Compile-only: every kernel builds for sm_90 and sm_80 without a GPU, with no spills.

Runs ``python -m dllm_decode.kernels.triton.aot`` in a subprocess with ``TRITON_INTERPRET``
unset (the interpreter replaces ``@triton.jit`` at definition time). Registers and spills
come from ``ptxas-blackwell -v`` bundled with the Triton wheel, when present. The default
run compiles the most demanding variant of each kernel; ``-m slow`` compiles all of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _require_aot_api() -> None:
    pytest.importorskip("triton")
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except ImportError as err:
        pytest.skip(f"this triton has no ahead-of-time compile API: {err}")
    import triton

    nvidia = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia")
    if not os.path.isdir(nvidia):
        pytest.skip("this triton wheel has no NVIDIA backend")


def _compile(*flags: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    res = subprocess.run([sys.executable, "-m", "dllm_decode.kernels.triton.aot", "--json",
                          *flags], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=1200)
    assert res.stdout.strip(), res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _check(results: list[dict]) -> None:
    assert {r["arch"] for r in results} == {90, 80}
    failed = [f"sm_{r['arch']} {r['name']}: {r['error']}" for r in results if not r["ok"]]
    assert not failed, "\n".join(failed)
    spilled = [r for r in results if r.get("spill_stores", 0) or r.get("spill_loads", 0)]
    assert not spilled, spilled


@pytest.mark.triton
def test_core_variants_compile_for_sm90_and_sm80():
    _require_aot_api()
    results = _compile("--core")
    assert {r["name"].split("/")[0] for r in results} == {"vocab", "attention", "kv_write",
                                                        "qkv_rope", "silu_mul"}
    _check(results)


@pytest.mark.slow
@pytest.mark.triton
def test_all_variants_compile_for_sm90_and_sm80():
    _require_aot_api()
    _check(_compile())
