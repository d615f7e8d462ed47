"""
Which of the trainer's kernels nvcc's FMA contraction changes, read from their PTX without a GPU.

Why: nvcc fuses a multiply and a dependent add into one fma by default (-fmad=true), rounding
once where the source rounds twice; the host compilers of the CPU reference and of cudasim do
not. A kernel whose arithmetic contraction changes computes other bits on a GPU than the same
source on the host, and no test without a GPU can see it: cudasim runs the source as written.
So the kernels that tests hold bit for bit to a host reference (AdamW and adamw8, the encoder,
every FP8 cast and weight cast, the scaling state machine, layernorm's output from its row
statistics, which the tile cast recomputes) must not change under contraction: their shared
element functions (llmc/element_math.h, quant8.h, fp8.h) write every multiply-add as an
explicit fmaf or keep the product apart. The kernels below do change, and each is held to its
reference with a tolerance, for the reason given. A kernel that starts or stops changing fails
here: check which test holds it bit for bit, then move it in or out of the list.

The check compares each kernel's count of fma.rn.f32 in build/ptx/train_gpt2_fp8.fmad-true.ptx
and fmad-false.ptx (make builds both): contraction only ever adds fmas.
"""
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PTX = {mode: os.path.join(ROOT, "build", "ptx", "train_gpt2_fp8.fmad-%s.ptx" % mode) for mode in ("true", "false")}

# kernel (demangled, without parameters) -> why no test holds it bit for bit to the host
CONTRACTED = {
    "fused_classifier_kernel": "the softmax sum's rescaling; the loss and dlogits meet the reference within "
                               "tolerances, the FP8 codes are checked as the host's encode of the kernel's own bf16",
    "layernorm_forward_kernel<0>": "the row variance's sum of squares; the output within 1e-2, mean and rstd 1e-5",
    "layernorm_forward_kernel<1>": "as <0>; the FP8 codes are checked as the host cast of the kernel's own output",
    "layernorm_forward_kernel<2>": "as <0> (the amax pass of current scaling)",
    "layernorm_backward_kernel<false>": "the row sums of dout * weight and of its product with x-hat; tolerances",
    "layernorm_backward_kernel<true>": "as <false>, with the residual gradient's sums",
    "global_norm_partials_kernel": "sums of squares; within 1e-5 of a double sum",
    "gelu_backward_inplace_kernel": "GELU's derivative (s + x u' e s^2); within one bf16 ulp, and its exp2 and "
                                    "reciprocal are approximate on the GPU anyway",
    "matmul_dbias_partial_kernel<true>": "the GELU derivative of its pre-GELU input, as gelu_backward_inplace_kernel",
    "fp8_cast_transpose_kernel<__nv_bfloat16, Fp8GeluBackwardTransform, Fp8OneCast>":
        "the GELU derivative, as gelu_backward_inplace_kernel; its bf16 output is checked against that kernel's, "
        "which inlines the same element function, and its codes as the host cast of its own output",
    "attention_forward_fallback_kernel<64>": "dot products and the online softmax; the fallback attention is held "
                                             "to the reference within tolerances",
    "attention_forward_fallback_kernel<128>": "as <64>",
    "attention_backward_query_kernel<64>": "as the forward fallback",
    "attention_backward_query_kernel<128>": "as the forward fallback",
    "attention_backward_key_kernel<64>": "as the forward fallback",
    "attention_backward_key_kernel<128>": "as the forward fallback",
}

# kernels that tests hold bit for bit to a host reference: they must be in the PTX, unchanged
BIT_EXACT = [
    "adamw_update_kernel<4>", "adamw8_update_kernel<true>", "encoder_forward_kernel",
    "fp8_cast_transpose_kernel<__nv_bfloat16, LayernormOutputTransform, Fp8OneCast>",
    "fp8_scaling_update_records_kernel", "fp8_weight_codes_kernel<float>",
]


def find_cxxfilt():
    found = shutil.which("c++filt")
    if found is None:
        pytest.fail("no c++filt on PATH (binutils)")
    return found


def kernel_fma_counts(path):
    """{demangled kernel name without its parameters: fma.rn.f32 count} of one PTX file's .entry functions"""
    assert os.path.exists(path), "%s is not built (make %s)" % (path, os.path.relpath(path, ROOT))
    text = open(path).read()
    starts = [(m.start(), m.group(1)) for m in re.finditer(r"^\.visible \.entry (\w+)\(", text, re.M)]
    assert starts, "%s holds no .entry function" % path
    mangled = [name for _, name in starts]
    demangled = subprocess.run([find_cxxfilt()], input="\n".join(mangled), capture_output=True, text=True,
                               check=True).stdout.split("\n")
    counts = {}
    for i, (start, _) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(text)
        name = re.sub(r"^void ", "", demangled[i]).split("(")[0]
        counts[name] = len(re.findall(r"\bfma\.rn\.f32\b", text[start:end]))
    return counts


def test_contraction_changes_exactly_the_listed_kernels():
    contracted, plain = kernel_fma_counts(PTX["true"]), kernel_fma_counts(PTX["false"])
    assert sorted(contracted) == sorted(plain), "the two PTX files hold different kernels"
    changed = {name for name in contracted if contracted[name] != plain[name]}
    fewer = sorted(name for name in changed if contracted[name] < plain[name])
    assert not fewer, "contraction removed fmas from %s (it only ever adds them)" % fewer
    missing = sorted(name for name in CONTRACTED if name not in contracted)
    assert not missing, "listed kernels no longer in the trainer: %s" % missing
    newly = sorted(changed - set(CONTRACTED))
    assert not newly, ("FMA contraction changes %s: on a GPU their arithmetic rounds otherwise than the same source "
                       "on the host and under cudasim. Write the multiply-add as an explicit fmaf (or keep the "
                       "product apart) where a test holds the result bit for bit; else list the kernel here with "
                       "the reason" % newly)
    no_longer = sorted(set(CONTRACTED) - changed)
    assert not no_longer, "listed as changed by contraction but no longer are: %s (take them off the list)" % no_longer


def test_bit_exact_kernels_are_compiled_and_unchanged():
    contracted, plain = kernel_fma_counts(PTX["true"]), kernel_fma_counts(PTX["false"])
    for name in BIT_EXACT:
        assert name in contracted, "%s is not in the trainer's PTX (renamed?)" % name
        assert contracted[name] == plain[name], "FMA contraction changes %s, which tests hold bit for bit" % name
