"""``ccall(address, (args...))``: call a C function by its address from ``@njit`` code.

Numba can call ctypes functions, but a ctypes object as a compiled function's
argument costs about 1.5 us per call to type-check, and one captured as a global
bakes its address into the machine code, which then cannot be cached on disk
(every process would compile the engine again: seconds). An address held in an
int64 array is neither: this intrinsic casts it to a function pointer whose C
signature follows the numba types of the arguments (int32 / int64 / uint64 ->
``int32_t`` / ``int64_t`` / ``uint64_t``) and returns the C ``int`` result, so the
caller picks each argument's width (a 4- or 8-byte MPI handle, an ``int`` count,
a pointer as int64).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic


@intrinsic
def ccall(typingctx, address, args):
    """``int f(args...)`` at ``address`` (an integer); ``args`` a tuple of integers."""
    if not isinstance(address, types.Integer) or not isinstance(args, types.BaseTuple):
        return None
    if not all(isinstance(t, types.Integer) for t in args.types):
        return None
    sig = types.int32(address, args)

    def codegen(context, builder, signature, llargs):
        addr, tup = llargs
        argtys = [context.get_value_type(t) for t in args.types]
        fnty = ir.FunctionType(ir.IntType(32), argtys)
        fn = builder.inttoptr(addr, fnty.as_pointer())
        values = [builder.extract_value(tup, i) for i in range(len(args.types))]
        return builder.call(fn, values)

    return sig, codegen


@intrinsic
def peek(typingctx, address):
    """The int64 at ``address`` (an integer), read with an atomic (monotonic) load: a
    flag another thread sets (hpcdp.comm.abort) is seen by a loop in compiled code."""
    if not isinstance(address, types.Integer):
        return None
    sig = types.int64(address)

    def codegen(context, builder, signature, llargs):
        ptr = builder.inttoptr(llargs[0], ir.IntType(64).as_pointer())
        return builder.load_atomic(ptr, "monotonic", 8)

    return sig, codegen
