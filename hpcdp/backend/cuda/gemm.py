"""Tiled GEMM: C[z] = op(A[z]) @ op(B[z]) with shared-memory tiles and register
blocking, batched over grid z (up to 3 broadcast batch dims), transposed operands
read in place (no materialised transpose).

A block computes a BM x BN tile of C with (BM/TM) x (BN/TN) threads; each thread
owns TM x TN accumulators in registers, at rows ``ty + i*(BM/TM)`` and columns
``tx + j*(BN/TN)`` (strided, so shared-memory reads are conflict-free and C
writes are coalesced). Per BK-slice of K the block stages A (as BK x BM, i.e.
transposed) and B (BK x BN) in shared memory; the load mapping follows the
operand's contiguous axis so global reads coalesce for both layouts. Edges
(partial tiles in M, N, K) load zeros and skip stores.

Three configurations: 16x16x16 with 2x2 per thread for small matrices, and (the lab's variants 3 and 4): 64x64x16 with 4x4 per thread,
and 128x128x8 with 8x8 per thread (more reuse per load: 2x the flops per
shared-memory byte, for large matrices).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda

from ._util import nbtype

TINY = (16, 16, 16, 2, 2)  # 64 threads: small matrices (attention heads, tests)
SMALL = (64, 64, 16, 4, 4)
LARGE = (128, 128, 8, 8, 8)
CONFIGS = {"16x16": TINY, "64x64": SMALL, "128x128": LARGE}


@lru_cache(maxsize=None)
def make_gemm(dtype, BM, BN, BK, TM, TN):
    t = nbtype(dtype)
    Z = np.dtype(dtype).type(0)
    THY, THX = BM // TM, BN // TN
    BMP = BM + 1  # padded row: no bank conflicts on the transposed store (a constant: shared shapes must be)
    NT = THX * THY
    A_LOADS = BM * BK // NT
    B_LOADS = BK * BN // NT
    assert A_LOADS * NT == BM * BK and B_LOADS * NT == BK * BN

    @cuda.jit
    def gemm(a, b, c, M, N, K, sa_m, sa_k, sb_k, sb_n, a_bs, b_bs, bshape, ta, tb):
        As = cuda.shared.array((BK, BMP), t)
        Bs = cuda.shared.array((BK, BN), t)
        acc = cuda.local.array((TM, TN), t)
        ra = cuda.local.array(TM, t)
        rb = cuda.local.array(TN, t)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        tid = ty * THX + tx
        m0 = cuda.blockIdx.y * BM
        n0 = cuda.blockIdx.x * BN
        z = cuda.blockIdx.z
        z2 = z % bshape[2]
        z1 = (z // bshape[2]) % bshape[1]
        z0 = z // (bshape[2] * bshape[1])
        a_off = z0 * a_bs[0] + z1 * a_bs[1] + z2 * a_bs[2]
        b_off = z0 * b_bs[0] + z1 * b_bs[1] + z2 * b_bs[2]
        c_off = z * M * N
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = Z
        for k0 in range(0, K, BK):
            for r in range(A_LOADS):
                lin = tid + r * NT
                if ta:
                    row = lin % BM
                    kk = lin // BM
                else:
                    row = lin // BK
                    kk = lin % BK
                gm = m0 + row
                gk = k0 + kk
                v = Z
                if gm < M and gk < K:
                    v = a[a_off + gm * sa_m + gk * sa_k]
                As[kk, row] = v
            for r in range(B_LOADS):
                lin = tid + r * NT
                if tb:
                    col = lin // BK
                    kk = lin % BK
                else:
                    col = lin % BN
                    kk = lin // BN
                gn = n0 + col
                gk = k0 + kk
                v = Z
                if gn < N and gk < K:
                    v = b[b_off + gk * sb_k + gn * sb_n]
                Bs[kk, col] = v
            cuda.syncthreads()
            for kk in range(BK):
                for i in range(TM):
                    ra[i] = As[kk, ty + i * THY]
                for j in range(TN):
                    rb[j] = Bs[kk, tx + j * THX]
                for i in range(TM):
                    for j in range(TN):
                        acc[i, j] += ra[i] * rb[j]
            cuda.syncthreads()
        for i in range(TM):
            gm = m0 + ty + i * THY
            if gm < M:
                for j in range(TN):
                    gn = n0 + tx + j * THX
                    if gn < N:
                        c[c_off + gm * N + gn] = acc[i, j]

    return gemm, (THX, THY)


def launch(a_flat, b_flat, c_flat, M, N, K, ta, tb, a_bs, b_bs, bshape, config=None):
    """C (batch, M, N) contiguous; A stored (M, K) or, if ta, (K, M); B stored (K, N)
    or, if tb, (N, K). a_bs/b_bs: element strides of the 3 padded batch dims (0 =
    broadcast); bshape: the 3 padded batch sizes."""
    if config is None:
        config = LARGE if M * N >= 1024 * 1024 else SMALL if M * N > 64 * 64 else TINY
    BM, BN, BK, TM, TN = config
    kern, threads = make_gemm(np.dtype(c_flat.dtype).str, BM, BN, BK, TM, TN)
    batch = bshape[0] * bshape[1] * bshape[2]
    if M * N * batch == 0:
        return
    if batch > 65535:
        raise ValueError(f"cuda matmul: batch of {batch} matrices exceeds the grid limit 65535")
    sa_m, sa_k = (1, M) if ta else (K, 1)
    sb_k, sb_n = (1, K) if tb else (N, 1)
    grid = ((N + BN - 1) // BN, (M + BM - 1) // BM, batch)
    kern[grid, threads](a_flat, b_flat, c_flat, M, N, K, sa_m, sa_k, sb_k, sb_n,
                        tuple(a_bs), tuple(b_bs), tuple(bshape), bool(ta), bool(tb))
