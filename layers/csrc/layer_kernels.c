/* Host kernels for the spatial layers (convolution's im2col / col2im, pooling, LRN, ReLU,
 * dropout), loaded with ctypes by layers/native.py.
 *
 * A plain C99 shared library (no Python C API): ctypes releases the GIL for each call.  Every
 * kernel exists for float (suffix _f32) and double (_f64); each performs the same float
 * operations, in the same order, as the NumPy code it replaces in the layers package, so the two
 * paths agree to rounding (exp comes from libm here and from NumPy there).
 *
 * All arrays are C-contiguous.  Sizes are int64 (ptrdiff_t).  The kernels are single-threaded on
 * purpose: when the GEMMs between them ran on NumPy's multithreaded BLAS, whose worker threads
 * busy-wait after each call, an OpenMP team over the outer loops on the same two cores made
 * whole nets several times slower (LeNet b64: 1180 ms, PyTorch 78 ms in the same loaded run; see
 * docs/history/2026-11-23.md).  The depthwise convolution's items run on threads of their own
 * (dw_run): the host GEMM's OpenBLAS now runs on one thread and caffe8's pool waits without
 * spinning.
 */
#define _POSIX_C_SOURCE 200809L
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* KERNEL (AVX2 and baseline clones, chosen at load), idx, C8_ABI: engine/csrc/c8_kernels.h.
 * Pooling's compare-and-select loops only vectorise with AVX2's blends (5 ms instead of 29 ms
 * for CaffeNet's pool1 at batch 16, see docs/history/2026-11-23.md). */
#include "c8_kernels.h"

#define C8L_ABI_VERSION 3

C8_ABI(c8l_abi_version, C8L_ABI_VERSION)

/* First and one-past-last output index o in [0, out) whose input o*stride - pad + offset lies
 * in [0, size): the valid run of one kernel offset, so the inner loops need no bounds test. */
static void valid_range(idx out, idx size, idx stride, idx pad, idx offset, idx *lo, idx *hi)
{
    idx first = pad - offset;            /* smallest o*stride allowed */
    idx a = first <= 0 ? 0 : (first + stride - 1) / stride;
    idx last = size - 1 + pad - offset;  /* largest o*stride allowed */
    idx b = last < 0 ? 0 : last / stride + 1;
    if (b > out) b = out;
    if (a > b) a = b;
    *lo = a;
    *hi = b;
}

/* The depthwise kernels' items (planes, or channels) on ``threads`` POSIX threads taking them
 * from a shared counter (the caller is one of them); each item is computed whole by one thread,
 * so the bits never depend on the thread count.  Threads are started per call: a depthwise
 * layer's work is milliseconds, a thread's start microseconds. */
struct dw_job {
    const void *a, *b;
    void *out;
    idx n, c, h, w, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow;
    idx count, next;
    void (*item)(const struct dw_job *, idx);
};

static void *dw_work(void *arg)
{
    struct dw_job *j = arg;
    for (idx i = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED); i < j->count;
         i = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED))
        j->item(j, i);
    return NULL;
}

static void dw_run(struct dw_job *j, idx threads)
{
    pthread_t helpers[63];
    idx started = 0;
    if (threads > j->count) threads = j->count;
    if (threads > 64) threads = 64;
    for (; started < threads - 1; started++)
        if (pthread_create(&helpers[started], NULL, dw_work, j))
            break;                   /* fewer threads: the same items, the same bits */
    dw_work(j);
    for (idx t = 0; t < started; t++)
        pthread_join(helpers[t], NULL);
}

#define DEFINE_KERNELS(T, SUF, MAXV)                                                             \
                                                                                                 \
/* cols from x (N, C, H, W); zero where a window reads the padding.  Row r = (c, ki, kj) of     \
 * image i starts at cols + r * rs + i * is: rs = N*OH*OW, is = OH*OW gives (C, KH, KW, N, OH, OW) \
 * (one GEMM for a batch); rs = OH*OW, is = C*KH*KW*OH*OW gives (N, C, KH, KW, OH, OW). */       \
KERNEL void c8l_im2col_##SUF(const T *x, idx n, idx c, idx h, idx w, idx kh, idx kw, idx ph, idx pw,   \
                      idx sh, idx sw, idx dh, idx dw, idx oh, idx ow, idx rs, idx is, T *cols)  \
{                                                                                                \
    idx rows = c * kh * kw;                                                                      \
    for (idx r = 0; r < rows; r++) {                                                             \
        idx ch = r / (kh * kw), ki = (r / kw) % kh, kj = r % kw;                                 \
        idx ylo, yhi, xlo, xhi;                                                                  \
        valid_range(oh, h, sh, ph, ki * dh, &ylo, &yhi);                                         \
        valid_range(ow, w, sw, pw, kj * dw, &xlo, &xhi);                                         \
        for (idx im = 0; im < n; im++) {                                                         \
            T *dst = cols + r * rs + im * is;                                                    \
            const T *plane = x + (im * c + ch) * h * w;                                          \
            for (idx y = 0; y < oh; y++, dst += ow) {                                            \
                if (y < ylo || y >= yhi) {                                                       \
                    memset(dst, 0, (size_t)ow * sizeof(T));                                      \
                    continue;                                                                    \
                }                                                                                \
                const T *row = plane + (y * sh - ph + ki * dh) * w - pw + kj * dw;               \
                for (idx o = 0; o < xlo; o++) dst[o] = 0;                                        \
                if (sw == 1)                                                                     \
                    memcpy(dst + xlo, row + xlo, (size_t)(xhi - xlo) * sizeof(T));               \
                else                                                                             \
                    for (idx o = xlo; o < xhi; o++) dst[o] = row[o * sw];                        \
                for (idx o = xhi; o < ow; o++) dst[o] = 0;                                       \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
}                                                                                                \
                                                                                                 \
/* dx (N, C, H, W) = the adjoint of im2col applied to cols (strides rs, is as there):           \
 * overlapping windows add up (in kernel-offset order, as the NumPy path), padding is dropped. */ \
KERNEL void c8l_col2im_##SUF(const T *cols, idx n, idx c, idx h, idx w, idx kh, idx kw, idx ph,         \
                      idx pw, idx sh, idx sw, idx dh, idx dw, idx oh, idx ow, idx rs, idx is,    \
                      T *dx)                                                                     \
{                                                                                                \
    for (idx ch = 0; ch < c; ch++) {                                                             \
        for (idx im = 0; im < n; im++)                                                           \
            memset(dx + (im * c + ch) * h * w, 0, (size_t)(h * w) * sizeof(T));                 \
        for (idx ki = 0; ki < kh; ki++) {                                                        \
            idx ylo, yhi;                                                                        \
            valid_range(oh, h, sh, ph, ki * dh, &ylo, &yhi);                                     \
            for (idx kj = 0; kj < kw; kj++) {                                                    \
                idx xlo, xhi;                                                                    \
                valid_range(ow, w, sw, pw, kj * dw, &xlo, &xhi);                                 \
                const T *src = cols + ((ch * kh + ki) * kw + kj) * rs;                           \
                for (idx im = 0; im < n; im++) {                                                 \
                    T *plane = dx + (im * c + ch) * h * w;                                       \
                    const T *s = src + im * is;                                                  \
                    for (idx y = ylo; y < yhi; y++) {                                            \
                        T *row = plane + (y * sh - ph + ki * dh) * w - pw + kj * dw;             \
                        const T *sr = s + y * ow;                                                \
                        if (sw == 1)                                                             \
                            for (idx o = xlo; o < xhi; o++) row[o] += sr[o];                     \
                        else                                                                     \
                            for (idx o = xlo; o < xhi; o++) row[o * sw] += sr[o];                \
                    }                                                                            \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
}                                                                                                \
                                                                                                 \
/* Caffe's MAX pooling over planes (P, H, W) -> (P, OH, OW): the window is clipped to the image  \
 * (hend = min(hstart + k, H) before hstart = max(hstart, 0)); the first strict maximum in       \
 * row-major order wins; mask = its flat h*W + w index (-1 when nothing beats -FLT_MAX).         \
 * One output row at a time, window offsets outside, outputs inside: the same candidates in the  \
 * same order per output as Caffe's scan, but branch-free and vectorisable. */                   \
KERNEL void c8l_maxpool_fwd_##SUF(const T *x, idx planes, idx h, idx w, idx kh, idx kw, idx ph,         \
                           idx pw, idx sh, idx sw, idx oh, idx ow, T *y, int32_t *mask)          \
{                                                                                                \
    for (idx p = 0; p < planes; p++) {                                                           \
        const T *in = x + p * h * w;                                                             \
        for (idx py = 0; py < oh; py++) {                                                        \
            T *restrict best = y + (p * oh + py) * ow;                                           \
            int32_t *restrict arg = mask + (p * oh + py) * ow;                                   \
            for (idx px = 0; px < ow; px++) {                                                    \
                best[px] = -(MAXV);                                                              \
                arg[px] = -1;                                                                    \
            }                                                                                    \
            idx y0 = py * sh - ph, y1 = y0 + kh < h ? y0 + kh : h;                               \
            if (y0 < 0) y0 = 0;                                                                  \
            for (idx yy = y0; yy < y1; yy++) {                                                   \
                for (idx kj = 0; kj < kw; kj++) {                                                \
                    idx lo, hi;                                                                  \
                    valid_range(ow, w, sw, pw, kj, &lo, &hi);                                    \
                    idx base = yy * w - pw + kj;                                                 \
                    const T *restrict row = in + base;                                           \
                    for (idx px = lo; px < hi; px++) {                                           \
                        T v = row[px * sw];                                                      \
                        int gt = v > best[px];                                                   \
                        best[px] = gt ? v : best[px];                                            \
                        arg[px] = gt ? (int32_t)(base + px * sw) : arg[px];                      \
                    }                                                                            \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
}                                                                                                \
                                                                                                 \
/* dx (P, H, W) = 0, then dy of every output added at its mask index. */                        \
KERNEL void c8l_maxpool_bwd_##SUF(const T *dy, const int32_t *mask, idx planes, idx h, idx w,           \
                           idx oh, idx ow, T *dx)                                                \
{                                                                                                \
    for (idx p = 0; p < planes; p++) {                                                           \
        T *g = dx + p * h * w;                                                                   \
        const T *d = dy + p * oh * ow;                                                           \
        const int32_t *m = mask + p * oh * ow;                                                   \
        memset(g, 0, (size_t)(h * w) * sizeof(T));                                               \
        for (idx i = 0; i < oh * ow; i++)                                                        \
            if (m[i] >= 0) g[m[i]] += d[i];                                                      \
    }                                                                                            \
}                                                                                                \
                                                                                                 \
/* Caffe's AVE pooling: the divisor counts padding (window clipped to H + pad, W + pad) but not  \
 * the ceil-mode overhang; the sum runs over the window clipped to the image. */                 \
KERNEL void c8l_avepool_fwd_##SUF(const T *x, idx planes, idx h, idx w, idx kh, idx kw, idx ph,         \
                           idx pw, idx sh, idx sw, idx oh, idx ow, T *y)                         \
{                                                                                                \
    for (idx p = 0; p < planes; p++) {                                                           \
        const T *in = x + p * h * w;                                                             \
        T *out = y + p * oh * ow;                                                                \
        for (idx py = 0; py < oh; py++) {                                                        \
            idx y0 = py * sh - ph, y1 = y0 + kh < h + ph ? y0 + kh : h + ph;                     \
            idx dyn = y1 - y0;                                                                   \
            if (y0 < 0) y0 = 0;                                                                  \
            if (y1 > h) y1 = h;                                                                  \
            for (idx px = 0; px < ow; px++) {                                                    \
                idx x0 = px * sw - pw, x1 = x0 + kw < w + pw ? x0 + kw : w + pw;                 \
                T size = (T)(dyn * (x1 - x0));                                                   \
                if (x0 < 0) x0 = 0;                                                              \
                if (x1 > w) x1 = w;                                                              \
                T total = 0;                                                                     \
                for (idx yy = y0; yy < y1; yy++)                                                 \
                    for (idx xx = x0; xx < x1; xx++)                                             \
                        total += in[yy * w + xx];                                                \
                out[py * ow + px] = total / size;                                                \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
}                                                                                                \
                                                                                                 \
KERNEL void c8l_avepool_bwd_##SUF(const T *dy, idx planes, idx h, idx w, idx kh, idx kw, idx ph,        \
                           idx pw, idx sh, idx sw, idx oh, idx ow, T *dx)                        \
{                                                                                                \
    for (idx p = 0; p < planes; p++) {                                                           \
        T *g = dx + p * h * w;                                                                   \
        const T *d = dy + p * oh * ow;                                                           \
        memset(g, 0, (size_t)(h * w) * sizeof(T));                                               \
        for (idx py = 0; py < oh; py++) {                                                        \
            idx y0 = py * sh - ph, y1 = y0 + kh < h + ph ? y0 + kh : h + ph;                     \
            idx dyn = y1 - y0;                                                                   \
            if (y0 < 0) y0 = 0;                                                                  \
            if (y1 > h) y1 = h;                                                                  \
            for (idx px = 0; px < ow; px++) {                                                    \
                idx x0 = px * sw - pw, x1 = x0 + kw < w + pw ? x0 + kw : w + pw;                 \
                T share = d[py * ow + px] / (T)(dyn * (x1 - x0));                                \
                if (x0 < 0) x0 = 0;                                                              \
                if (x1 > w) x1 = w;                                                              \
                for (idx yy = y0; yy < y1; yy++)                                                 \
                    for (idx xx = x0; xx < x1; xx++)                                             \
                        g[yy * w + xx] += share;                                                 \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
}                                                                                                \
                                                                                                 \
/* Sum over channels [c - half, c + half] (missing ones are zero) of src (N, C, HW), added in   \
 * channel order as the NumPy box sum does; one image-channel plane at a time. */               \
static void lrn_window_##SUF(idx c, idx hw, idx size, const T *plane0, idx ch, T *acc)           \
{                                                                                                \
    idx half = (size - 1) / 2;                                                                   \
    for (idx i = 0; i < hw; i++) acc[i] = 0;                                                     \
    for (idx o = 0; o < size; o++) {                                                             \
        idx cc = ch - half + o;                                                                  \
        if (cc < 0 || cc >= c) continue;                                                         \
        const T *s = plane0 + cc * hw;                                                           \
        for (idx i = 0; i < hw; i++) acc[i] += s[i];                                             \
    }                                                                                            \
}                                                                                                \
                                                                                                 \
/* ACROSS_CHANNELS LRN scale = k + a * window_sum(x^2) of x (N, C, HW); the power and the      \
 * product stay in NumPy, whose SIMD pow is faster than libm's.  sq: a (C*HW) scratch. */       \
KERNEL void c8l_lrn_scale_##SUF(const T *x, idx n, idx c, idx hw, idx size, T a, T k, T *scale, T *sq)  \
{                                                                                                \
    for (idx im = 0; im < n; im++) {                                                             \
        const T *xi = x + im * c * hw;                                                           \
        for (idx i = 0; i < c * hw; i++) sq[i] = xi[i] * xi[i];                                  \
        for (idx ch = 0; ch < c; ch++) {                                                         \
            T *s = scale + (im * c + ch) * hw;                                                   \
            lrn_window_##SUF(c, hw, size, sq, ch, s);                                            \
            for (idx i = 0; i < hw; i++) s[i] = k + a * s[i];                                    \
        }                                                                                        \
    }                                                                                            \
}                                                                                                \
                                                                                                 \
/* dx = dy * scale^-beta - coeff * x * window_sum(dy * y / scale), coeff = 2 a beta. */          \
KERNEL void c8l_lrn_bwd_##SUF(const T *x, const T *y, const T *dy, const T *scale, const T *pw_in,      \
                       idx n, idx c, idx hw, idx size, T coeff, T *dx, T *ratio)                 \
{                                                                                                \
    for (idx im = 0; im < n; im++) {                                                             \
        idx base = im * c * hw;                                                                  \
        for (idx i = 0; i < c * hw; i++)                                                         \
            ratio[i] = dy[base + i] * y[base + i] / scale[base + i];                             \
        for (idx ch = 0; ch < c; ch++) {                                                         \
            idx off = base + ch * hw;                                                            \
            T *g = dx + off;                                                                     \
            lrn_window_##SUF(c, hw, size, ratio, ch, g);                                  \
            for (idx i = 0; i < hw; i++)                                                         \
                g[i] = dy[off + i] * pw_in[off + i] - coeff * x[off + i] * g[i];                 \
        }                                                                                        \
    }                                                                                            \
}                                                                                                \
                                                                                                 \
/* Leaky ReLU: y = max(x, 0) + slope * min(x, 0) in one pass (in place allowed); NaN stays NaN \
 * as with Caffe's std::max. */                                                                  \
KERNEL void c8l_relu_fwd_##SUF(const T *x, idx count, T slope, T *y)                                    \
{                                                                                                \
    for (idx i = 0; i < count; i++) {                                                            \
        T v = x[i];                                                                              \
        y[i] = (v < 0 ? 0 : v) + (v < 0 ? v : 0) * slope;                                        \
    }                                                                                            \
}                                                                                                \
                                                                                                 \
/* Caffe's dx = dy * ((ref > 0) + slope * (ref <= 0)) in one pass (ref is x, or y when          \
 * slope >= 0); a product, not a select, so a NaN in dy propagates as in Caffe. */               \
KERNEL void c8l_relu_bwd_##SUF(const T *dy, const T *ref, idx count, T slope, T *dx)                    \
{                                                                                                \
    for (idx i = 0; i < count; i++) dx[i] = dy[i] * (ref[i] > 0 ? (T)1 : slope);                 \
}                                                                                                \
                                                                                                 \
/* Dropout: mask = (u >= ratio) * scale, y = x * mask (u may alias mask; in place allowed). */   \
KERNEL void c8l_dropout_fwd_##SUF(const T *x, const T *u, idx count, T ratio, T scale, T *mask, T *y)   \
{                                                                                                \
    for (idx i = 0; i < count; i++) {                                                            \
        T m = u[i] >= ratio ? scale : 0;                                                         \
        mask[i] = m;                                                                             \
        y[i] = x[i] * m;                                                                         \
    }                                                                                            \
}                                                                                                \
                                                                                                 \
/* Depthwise 2-D convolution (group = channels = outputs, MobileNet's 3x3 layers), directly:     \
 * im2col + GEMM made one 1 x K x P product per image and channel.  Planes are (image, channel) \
 * of x / y (N, C, H, W) / (N, C, OH, OW); w is (C, KH, KW).  Each output is a sum over the     \
 * taps in (ki, kj) order, so the results agree with the GEMM's to rounding.  An item (a plane, \
 * or a channel for the weight gradient) is computed whole by one thread, in one order: the     \
 * bits do not depend on ``threads`` (dw_run).                                                   \
 * Forward: y = conv(x, w), overwritten; one plane. */                                           \
KERNEL static void dwconv_fwd_plane_##SUF(const struct dw_job *j, idx p)                         \
{                                                                                                \
    const idx c = j->c, h = j->h, w = j->w, kh = j->kh, kw = j->kw, oh = j->oh, ow = j->ow;      \
    const idx sh = j->sh, sw = j->sw, ph = j->ph, pw = j->pw, dh = j->dh, dw = j->dw;            \
    const T *xp = (const T *)j->a + p * h * w, *wc = (const T *)j->b + (p % c) * kh * kw;        \
    T *yp = (T *)j->out + p * oh * ow;                                                           \
    memset(yp, 0, sizeof(T) * (size_t)(oh * ow));                                                \
    for (idx ki = 0; ki < kh; ki++) {                                                            \
        idx ylo, yhi;                                                                            \
        valid_range(oh, h, sh, ph, ki * dh, &ylo, &yhi);                                         \
        for (idx kj = 0; kj < kw; kj++) {                                                        \
            idx xlo, xhi;                                                                        \
            valid_range(ow, w, sw, pw, kj * dw, &xlo, &xhi);                                     \
            const T wv = wc[ki * kw + kj];                                                       \
            for (idx oy = ylo; oy < yhi; oy++) {                                                 \
                const T *row = xp + (oy * sh - ph + ki * dh) * w;                                \
                const idx off = kj * dw - pw;                                                    \
                T *out = yp + oy * ow;                                                           \
                if (sw == 1)                                                                     \
                    for (idx ox = xlo; ox < xhi; ox++) out[ox] += wv * row[ox + off];            \
                else                                                                             \
                    for (idx ox = xlo; ox < xhi; ox++) out[ox] += wv * row[ox * sw + off];       \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
}                                                                                                \
                                                                                                 \
/* Depthwise backward-data: dx (N, C, H, W) = the adjoint of the forward applied to dy,         \
 * overwritten; each input gathers its taps in the forward's (ki, kj, oy, ox) order. */          \
KERNEL static void dwconv_bwd_plane_##SUF(const struct dw_job *j, idx p)                         \
{                                                                                                \
    const idx c = j->c, h = j->h, w = j->w, kh = j->kh, kw = j->kw, oh = j->oh, ow = j->ow;      \
    const idx sh = j->sh, sw = j->sw, ph = j->ph, pw = j->pw, dh = j->dh, dw = j->dw;            \
    const T *dyp = (const T *)j->a + p * oh * ow, *wc = (const T *)j->b + (p % c) * kh * kw;     \
    T *dxp = (T *)j->out + p * h * w;                                                            \
    memset(dxp, 0, sizeof(T) * (size_t)(h * w));                                                \
    for (idx ki = 0; ki < kh; ki++) {                                                            \
        idx ylo, yhi;                                                                            \
        valid_range(oh, h, sh, ph, ki * dh, &ylo, &yhi);                                         \
        for (idx kj = 0; kj < kw; kj++) {                                                        \
            idx xlo, xhi;                                                                        \
            valid_range(ow, w, sw, pw, kj * dw, &xlo, &xhi);                                     \
            const T wv = wc[ki * kw + kj];                                                       \
            for (idx oy = ylo; oy < yhi; oy++) {                                                 \
                T *row = dxp + (oy * sh - ph + ki * dh) * w;                                     \
                const idx off = kj * dw - pw;                                                    \
                const T *g = dyp + oy * ow;                                                      \
                if (sw == 1)                                                                     \
                    for (idx ox = xlo; ox < xhi; ox++) row[ox + off] += wv * g[ox];              \
                else                                                                             \
                    for (idx ox = xlo; ox < xhi; ox++) row[ox * sw + off] += wv * g[ox];         \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
}                                                                                                \
                                                                                                 \
/* Depthwise weight gradient of one channel: dwt[ch] (KH, KW) += sum over images and outputs of \
 * dy * x at each tap.  A row's products are summed in 8 lanes (a fixed order the compiler can  \
 * vectorise), the rows of every image in double, then added to dwt once. */                    \
KERNEL static void dwconv_wgrad_channel_##SUF(const struct dw_job *j, idx ch)                    \
{                                                                                                \
    const idx n = j->n, c = j->c, h = j->h, w = j->w, kh = j->kh, kw = j->kw, oh = j->oh;        \
    const idx ow = j->ow, sh = j->sh, sw = j->sw, ph = j->ph, pw = j->pw, dh = j->dh;            \
    const idx dw = j->dw;                                                                        \
    const T *x = (const T *)j->a, *dy = (const T *)j->b;                                         \
    T *dwt = (T *)j->out;                                                                        \
    for (idx ki = 0; ki < kh; ki++) {                                                            \
        idx ylo, yhi;                                                                            \
        valid_range(oh, h, sh, ph, ki * dh, &ylo, &yhi);                                         \
        for (idx kj = 0; kj < kw; kj++) {                                                        \
            idx xlo, xhi;                                                                        \
            valid_range(ow, w, sw, pw, kj * dw, &xlo, &xhi);                                     \
            double total = 0;                                                                    \
            for (idx im = 0; im < n; im++) {                                                     \
                const T *xp = x + (im * c + ch) * h * w, *dyp = dy + (im * c + ch) * oh * ow;    \
                for (idx oy = ylo; oy < yhi; oy++) {                                             \
                    const T *row = xp + (oy * sh - ph + ki * dh) * w;                            \
                    const idx off = kj * dw - pw;                                                \
                    const T *g = dyp + oy * ow;                                                  \
                    T lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                        \
                    idx ox = xlo;                                                                \
                    for (; ox + 8 <= xhi; ox += 8)                                               \
                        for (int l = 0; l < 8; l++)                                              \
                            lane[l] += g[ox + l] * row[(ox + l) * sw + off];                     \
                    for (int l = 0; ox < xhi; ox++, l++)                                         \
                        lane[l] += g[ox] * row[ox * sw + off];                                   \
                    total += (double)(((lane[0] + lane[1]) + (lane[2] + lane[3]))                \
                                      + ((lane[4] + lane[5]) + (lane[6] + lane[7])));            \
                }                                                                                \
            }                                                                                    \
            dwt[(ch * kh + ki) * kw + kj] += (T)total;                                           \
        }                                                                                        \
    }                                                                                            \
}                                                                                                \
                                                                                                 \
/* The three entry points: a, b, out as each item function reads them; ``threads`` workers. */  \
void c8l_dwconv_fwd_##SUF(const T *x, const T *wt, idx n, idx c, idx h, idx w, idx kh, idx kw,   \
                          idx ph, idx pw, idx sh, idx sw, idx dh, idx dw, idx oh, idx ow, T *y,  \
                          idx threads)                                                           \
{                                                                                                \
    struct dw_job j = {x, wt, y, n, c, h, w, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, n * c, 0,   \
                       dwconv_fwd_plane_##SUF};                                                  \
    dw_run(&j, threads);                                                                         \
}                                                                                                \
void c8l_dwconv_bwd_##SUF(const T *dy, const T *wt, idx n, idx c, idx h, idx w, idx kh, idx kw,  \
                          idx ph, idx pw, idx sh, idx sw, idx dh, idx dw, idx oh, idx ow, T *dx, \
                          idx threads)                                                           \
{                                                                                                \
    struct dw_job j = {dy, wt, dx, n, c, h, w, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, n * c, 0, \
                       dwconv_bwd_plane_##SUF};                                                  \
    dw_run(&j, threads);                                                                         \
}                                                                                                \
void c8l_dwconv_wgrad_##SUF(const T *x, const T *dy, idx n, idx c, idx h, idx w, idx kh, idx kw, \
                            idx ph, idx pw, idx sh, idx sw, idx dh, idx dw, idx oh, idx ow,      \
                            T *dwt, idx threads)                                                 \
{                                                                                                \
    struct dw_job j = {x, dy, dwt, n, c, h, w, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, c, 0,     \
                       dwconv_wgrad_channel_##SUF};                                              \
    dw_run(&j, threads);                                                                         \
}                                                                                                \

DEFINE_KERNELS(float, f32, FLT_MAX)
DEFINE_KERNELS(double, f64, FLT_MAX)
