/* Host kernels of the solvers, loaded with ctypes by solvers/native.py.
 *
 * A plain C99 shared library (no Python C API): ctypes releases the GIL for each call.  Each
 * kernel performs the same float operations, in the same order and the same precision, as the
 * NumPy sequence it replaces in solvers/sgd.py (built with -ffp-contract=off: no fused
 * multiply-add), so both paths give the same bits; it only reads and writes each array once
 * instead of once per NumPy statement.
 */
#include "c8_kernels.h"           /* KERNEL, idx, C8_ABI: engine/csrc/c8_kernels.h */

#define C8S_ABI_VERSION 2

C8_ABI(c8s_abi_version, C8S_ABI_VERSION)

/* Caffe's SGD step for one parameter, then its part of Net::Update:
 *   h = momentum * h + rate * g;   g = h;   w -= g
 * (NumPy: tmp = g * rate; h *= momentum; h += tmp; g[...] = h; w -= g). */
#define MOMENTUM_STEPS(T, w, g, h, n, rate, momentum)                                     \
    for (idx i = 0; i < (n); ++i) {                                                       \
        T t = (g)[i] * (rate);                                                            \
        T m = (h)[i] * (momentum);                                                        \
        T v = m + t;                                                                      \
        (h)[i] = v;                                                                       \
        (g)[i] = v;                                                                       \
        (w)[i] = (w)[i] - v;                                                              \
    }
#define SGD_MOMENTUM(NAME, T)                                                             \
    KERNEL void NAME(T *restrict w, T *restrict g, T *restrict h, idx n, T rate,          \
                     T momentum)                                                          \
    {                                                                                     \
        MOMENTUM_STEPS(T, w, g, h, n, rate, momentum)                                     \
    }
SGD_MOMENTUM(c8s_sgd_momentum_f32, float)
SGD_MOMENTUM(c8s_sgd_momentum_f64, double)

/* Caffe's whole ApplyUpdate for plain momentum SGD, every listed param of a net whose params
 * live in flat buffers (w, g, h: data, diff and history at the same offsets), param j being
 * elements starts[j] .. starts[j] + counts[j] - 1, in one call instead of one NumPy sequence per
 * param (for a small net, that sequence's Python cost was most of the update):
 *   normalize (iter_size > 1):  g *= inv_size
 *   regularize (L2, decays[j] != 0; NumPy skips a zero decay, and so must we: 0 * w is not
 *   always 0):                  t = w * decays[j];  g += t
 *   the momentum step above (MOMENTUM_STEPS) with rates[j].
 * Each element's operations are the NumPy sequence's, in its order and precision. */
#define SGD_UPDATE(NAME, T)                                                               \
    KERNEL void NAME(T *restrict w, T *restrict g, T *restrict h, const idx *starts,       \
                     const idx *counts, const T *rates, const T *decays, idx nparams,      \
                     int normalize, T inv_size, T momentum)                               \
    {                                                                                     \
        for (idx j = 0; j < nparams; ++j) {                                               \
            T *restrict wj = w + starts[j], *restrict gj = g + starts[j];                 \
            T *restrict hj = h + starts[j];                                               \
            const idx n = counts[j];                                                      \
            const T rate = rates[j], decay = decays[j];                                   \
            if (normalize)                                                                \
                for (idx i = 0; i < n; ++i)                                               \
                    gj[i] = gj[i] * inv_size;                                             \
            if (decay != 0)                                                               \
                for (idx i = 0; i < n; ++i) {                                             \
                    T t = wj[i] * decay;                                                  \
                    gj[i] = gj[i] + t;                                                    \
                }                                                                         \
            MOMENTUM_STEPS(T, wj, gj, hj, n, rate, momentum)                              \
        }                                                                                 \
    }
SGD_UPDATE(c8s_sgd_update_f32, float)
SGD_UPDATE(c8s_sgd_update_f64, double)

/* 1 when every element is finite (no Inf, no NaN), else 0; stops at the first that is not. */
#define ALL_FINITE(NAME, T, U, EXP)                                                       \
    KERNEL int NAME(const U *restrict x, idx n)                                           \
    {                                                                                     \
        const idx block = 4096;                                                           \
        for (idx s = 0; s < n; s += block) {                                              \
            idx e = s + block < n ? s + block : n;                                        \
            U bad = 0;                                                                    \
            for (idx i = s; i < e; ++i)                                                   \
                bad |= (U)((x[i] & EXP) == EXP);                                          \
            if (bad)                                                                      \
                return 0;                                                                 \
        }                                                                                 \
        return 1;                                                                         \
    }
ALL_FINITE(c8s_all_finite_f32, float, unsigned int, 0x7f800000u)
ALL_FINITE(c8s_all_finite_f64, double, unsigned long long, 0x7ff0000000000000ull)
