"""Low-bit formats on a 4096 x 4096 float32 weight: observers_core (torch backend) vs torchao, same data,
same process, medians of timed repeats, ratio = ours / torchao (below 1: ours is faster).

Cases:
- MX (fp8_e4m3 and fp4_e2m1, blocks of 32 along the last axis, floor): shared exponents alone
  (ours: ``block_aminmax`` + ``mx_scale``; torchao: ``to_mx``, which also casts the elements) and
  quantize-dequantize (ours: + ``mx_fake_quantize``; torchao: ``to_mx`` + ``to_dtype``).
- per-group int4 (groups of 128, asymmetric): qparams (ours: ``group_aminmax`` + ``group_qparams``;
  torchao: ``choose_qparams_affine``) and fake quantization (+ ``group_fake_quantize`` vs
  ``_fake_quantize_affine``).

Usage: ``python benchmarks/bench_lowbit.py [--device cuda] [--repeat 5]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import machine_line  # noqa: E402


def machine(device: str) -> str:
    """The shared machine line, plus torch's threads and the GPU."""
    import torch

    gpu = torch.cuda.get_device_name() if device == "cuda" else "none"
    return f"{machine_line('torch')}; torch threads {torch.get_num_threads()}, GPU {gpu}"


def timed_pair(ours, theirs, repeat: int, sync) -> tuple[float, float]:
    """Median seconds of ``ours`` and ``theirs``, interleaved run by run so that load drifts on a shared
    machine hit both alike; one warm-up each (allocations, kernel selection)."""
    t = {ours: [], theirs: []}
    for fn in (ours, theirs):
        fn()
    sync()
    for _ in range(repeat):
        for fn in (ours, theirs):
            t0 = time.perf_counter()
            fn()
            sync()
            t[fn].append(time.perf_counter() - t0)
    return statistics.median(t[ours]), statistics.median(t[theirs])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--size", type=int, default=4096)
    args = parser.parse_args()

    import torch

    print(machine(args.device))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torchao
        from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
        from torchao.quantization.quant_primitives import MappingType, _fake_quantize_affine, choose_qparams_affine
    import observers_core as oc

    print(f"torchao {torchao.__version__}, observers_core {oc.__version__}")
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    w = torch.randn(args.size, args.size, generator=torch.Generator().manual_seed(0)).to(args.device)
    print(f"data: {args.size} x {args.size} float32 weight on {args.device}, median of {args.repeat} interleaved runs\n")
    print(f"{'case':44s} {'ours ms':>9s} {'torchao ms':>11s} {'ratio':>7s}")

    def report(name, ours, theirs):
        t_ours, t_theirs = timed_pair(ours, theirs, args.repeat, sync)
        print(f"{name:44s} {t_ours * 1e3:9.1f} {t_theirs * 1e3:11.1f} {t_ours / t_theirs:7.2f}")

    mx_elements = {"fp8_e4m3": torch.float8_e4m3fn, "fp4_e2m1": torch.float4_e2m1fn_x2}
    for element, tel in mx_elements.items():

        def ours_scale(element=element):
            lo, hi = oc.block_aminmax(w, block_size=32)
            return oc.mx_scale(torch.maximum(-lo, hi), element=element)

        def ours_fq(element=element):
            return oc.mx_fake_quantize(w, ours_scale().exponent, element=element)

        def theirs_fq(tel=tel):
            scale, data = to_mx(w, tel, 32)
            return to_dtype(data, scale, tel, 32, torch.float32)

        # parity on this data before timing: same exponents, same values on blocks with a nonzero code
        code = ours_scale().exponent
        scale_t, _ = to_mx(w, tel, 32)
        assert torch.equal(code, scale_t.view(torch.uint8)), "exponents differ from torchao"
        assert torch.equal(ours_fq(), theirs_fq()), "fake-quantized values differ from torchao"
        report(f"MX {element} shared exponents (to_mx)", ours_scale, lambda tel=tel: to_mx(w, tel, 32))
        report(f"MX {element} quantize-dequantize", ours_fq, theirs_fq)

    def ours_qparams():
        lo, hi = oc.group_aminmax(w, axis=-1, group_size=128)
        return oc.group_qparams(lo, hi, dtype="int4")

    eps = torch.finfo(torch.float32).eps

    def theirs_qparams():
        return choose_qparams_affine(w, MappingType.ASYMMETRIC, (1, 128), torch.int8, -8, 7, eps=eps)

    def ours_group_fq():
        s, z = ours_qparams()
        return oc.group_fake_quantize(w, s, z, dtype="int4", axis=-1, group_size=128)

    def theirs_group_fq():
        s, z = theirs_qparams()
        return _fake_quantize_affine(w, (1, 128), s, z, torch.int8, -8, 7)

    s, z = ours_qparams()
    s_t, z_t = theirs_qparams()
    assert torch.equal(s, s_t) and torch.equal(z, z_t), "int4 qparams differ from torchao"
    assert torch.equal(ours_group_fq(), theirs_group_fq()), "int4 fake quantization differs from torchao"
    report("per-group int4 g128 qparams", ours_qparams, theirs_qparams)
    report("per-group int4 g128 quantize-dequantize", ours_group_fq, theirs_group_fq)


if __name__ == "__main__":
    main()
