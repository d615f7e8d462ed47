"""
dev/bench/sass_path.py, the count of the instructions a kernel's loop executes on its common
path, and the budget it holds adamw8's block step to:
- the walk on a made-up listing: a slow-path call jumped over, an unconditional forward branch
  taken, another conditional branch falling through, the back edge ending the pass;
- adamw8's common path (build/adamw8_sass_probe.cubin, make test builds it) executes at most
  125 instructions an element. The pass is bound by instruction issue above about 110 (16
  bytes an element on an H100/H200, doc/adamw8.md); the bucket encode and the other changes of
  2026-12-01 brought it from about 400 (the binary search's version) to about 175, and the
  reciprocal per block instead of a division per value (quant8_divisor) to about 153, and the
  maps' +inf after their last entry (no index test in the encode) to about 147, and one random
  hash for two elements' stochastic rounding (rounding_bits) to about 130, and the encode's
  thresholds (a bucket's entry and one compare) to about 115.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "dev", "bench"))
import sass_path  # noqa: E402

ADAMW8_BUDGET_PER_ELEMENT = 125

LISTING = """
        Function : _Z4demoPf
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   FADD R2, R2, R3 ;
        /*0020*/                   MUFU.RCP R4, R2 ;
        /*0030*/                   FCHK P0, R5, R2 ;
        /*0040*/               @!P0 BRA 0x80 ;
        /*0050*/                   MOV R6, 0x70 ;
        /*0060*/                   CALL.REL.NOINC 0x100 ;
        /*0070*/                   MOV R7, R6 ;
        /*0080*/               @P1 BRA 0xb0 ;
        /*0090*/                   FMUL R8, R4, R5 ;
        /*00a0*/                   BRA 0xc0 ;
        /*00b0*/                   FMUL R8, R4, R4 ;
        /*00c0*/               @P2 BRA 0x10 ;
        /*00d0*/                   EXIT ;
        /*0100*/                   RET.REL.NODEC R6 0x0 ;
        Function : _Z5otherPf
        /*0000*/                   EXIT ;
"""


def test_walk_of_a_made_up_loop():
    code = sass_path.function_sass(LISTING, "demo")
    assert sass_path.outermost_loop(code) == (0x10, 0xc0)
    executed, per_opcode = sass_path.walk(code, 0x10, 0xc0)
    # FADD, MUFU, FCHK, the branch over the call, the branch at 0x80 falling through, FMUL,
    # the unconditional branch over 0xb0, the back edge
    assert executed == 8
    assert per_opcode == {"FADD": 1, "MUFU": 1, "FCHK": 1, "BRA": 4, "FMUL": 1}


def test_adamw8_common_path_budget():
    cubin = os.path.join(ROOT, "build", "adamw8_sass_probe.cubin")
    assert os.path.exists(cubin), "%s is not built (make build/adamw8_sass_probe.cubin)" % cubin
    _, _, executed, per_opcode = sass_path.common_path(cubin, "adamw8_sass_probe")
    per_element = executed / 8  # a lane's 8 elements a pass
    assert per_element <= ADAMW8_BUDGET_PER_ELEMENT, (
        "adamw8's block step executes %.1f instructions an element, over its budget of %d (doc/adamw8.md): %s"
        % (per_element, ADAMW8_BUDGET_PER_ELEMENT, per_opcode))
