"""Naive, loop-by-loop references for the spatial layers (Caffe's CPU loops, written out).

Deliberately slow and direct: no im2col, no GEMM, no strided slicing, so that the vectorised
layers are checked against an independent code path. Arrays are float64 NumPy.
"""
import math

import numpy


def conv_forward(x, w, b, stride, pad, dilation, group):
    """Direct 2-D cross-correlation. x (N,C,H,W), w (O,C/g,kh,kw), b (O,) or None."""
    n_, c_, h_, w_ = x.shape
    o_, cg, kh, kw = w.shape
    oh = (h_ + 2 * pad[0] - (dilation[0] * (kh - 1) + 1)) // stride[0] + 1
    ow = (w_ + 2 * pad[1] - (dilation[1] * (kw - 1) + 1)) // stride[1] + 1
    og = o_ // group
    y = numpy.zeros((n_, o_, oh, ow))
    for n in range(n_):
        for o in range(o_):
            g = o // og
            for py in range(oh):
                for px in range(ow):
                    acc = 0.0 if b is None else b[o]
                    for ci in range(cg):
                        c = g * cg + ci
                        for i in range(kh):
                            for j in range(kw):
                                hy = py * stride[0] - pad[0] + i * dilation[0]
                                wx = px * stride[1] - pad[1] + j * dilation[1]
                                if 0 <= hy < h_ and 0 <= wx < w_:
                                    acc += w[o, ci, i, j] * x[n, c, hy, wx]
                    y[n, o, py, px] = acc
    return y


def conv3d_forward(x, w, b):
    """Direct 3-D cross-correlation, stride 1, no padding. x (N,C,D,H,W), w (O,C,kd,kh,kw)."""
    n_, c_, d_, h_, w_ = x.shape
    o_, _, kd, kh, kw = w.shape
    y = numpy.zeros((n_, o_, d_ - kd + 1, h_ - kh + 1, w_ - kw + 1))
    for n in range(n_):
        for o in range(o_):
            for z in range(y.shape[2]):
                for r in range(y.shape[3]):
                    for s in range(y.shape[4]):
                        acc = b[o]
                        for c in range(c_):
                            for a in range(kd):
                                for i in range(kh):
                                    for j in range(kw):
                                        acc += w[o, c, a, i, j] * x[n, c, z + a, r + i, s + j]
                        y[n, o, z, r, s] = acc
    return y


def pooled_len(size, k, pad, stride, ceil_mode):
    """Caffe's PoolingLayer::Reshape length computation."""
    if ceil_mode:
        out = int(math.ceil(float(size + 2 * pad - k) / stride)) + 1
    else:
        out = int(math.floor(float(size + 2 * pad - k) / stride)) + 1
    if pad and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def pool_forward(x, method, kernel, stride, pad, ceil_mode=True):
    """Caffe's Forward_cpu loops. Returns (top, argmax mask as flat h*W+w, or None for AVE)."""
    n_, c_, h_, w_ = x.shape
    ph_ = pooled_len(h_, kernel[0], pad[0], stride[0], ceil_mode)
    pw_ = pooled_len(w_, kernel[1], pad[1], stride[1], ceil_mode)
    top = numpy.zeros((n_, c_, ph_, pw_))
    mask = numpy.full((n_, c_, ph_, pw_), -1.0)
    for n in range(n_):
        for c in range(c_):
            for ph in range(ph_):
                for pw in range(pw_):
                    hs, ws = ph * stride[0] - pad[0], pw * stride[1] - pad[1]
                    he, we = min(hs + kernel[0], h_ + pad[0]), min(ws + kernel[1], w_ + pad[1])
                    pool_size = (he - hs) * (we - ws)
                    hs, ws, he, we = max(hs, 0), max(ws, 0), min(he, h_), min(we, w_)
                    if method == "MAX":
                        best, arg = -numpy.finfo(numpy.float32).max, -1
                        for hh in range(hs, he):
                            for ww in range(ws, we):
                                if x[n, c, hh, ww] > best:
                                    best, arg = x[n, c, hh, ww], hh * w_ + ww
                        top[n, c, ph, pw], mask[n, c, ph, pw] = best, arg
                    else:
                        total = 0.0
                        for hh in range(hs, he):
                            for ww in range(ws, we):
                                total += x[n, c, hh, ww]
                        top[n, c, ph, pw] = total / pool_size
    return top, (mask if method == "MAX" else None)


def max_pool_backward(dy, mask, bottom_shape):
    """Send each top gradient to its argmax; overlapping windows accumulate."""
    dx = numpy.zeros(bottom_shape)
    n_, c_, ph_, pw_ = dy.shape
    width = bottom_shape[3]
    for n in range(n_):
        for c in range(c_):
            for ph in range(ph_):
                for pw in range(pw_):
                    idx = int(mask[n, c, ph, pw])
                    if idx >= 0:
                        dx[n, c, idx // width, idx % width] += dy[n, c, ph, pw]
    return dx


def lrn_forward(x, size, alpha, beta, k, region):
    """LRN by direct window sums at every (n, c, h, w)."""
    n_, c_, h_, w_ = x.shape
    half = (size - 1) // 2
    y = numpy.zeros_like(x)
    for n in range(n_):
        for c in range(c_):
            for h in range(h_):
                for w in range(w_):
                    s = 0.0
                    if region == "ACROSS_CHANNELS":
                        for cc in range(c - half, c + half + 1):
                            if 0 <= cc < c_:
                                s += x[n, cc, h, w] ** 2
                        scale = k + alpha / size * s
                    else:
                        for hh in range(h - half, h + half + 1):
                            for ww in range(w - half, w + half + 1):
                                if 0 <= hh < h_ and 0 <= ww < w_:
                                    s += x[n, c, hh, ww] ** 2
                        scale = 1.0 + alpha / (size * size) * s
                    y[n, c, h, w] = x[n, c, h, w] * scale ** (-beta)
    return y


def inner_product_forward(x, w, b, axis, transpose):
    """y[m, j] = sum_k x[m, k] * W[j, k] (+ b[j]), x flattened from ``axis``."""
    lead = x.shape[:axis]
    x2 = x.reshape(int(numpy.prod(lead)), -1)
    m_, k_ = x2.shape
    n_ = w.shape[1] if transpose else w.shape[0]
    y = numpy.zeros((m_, n_))
    for m in range(m_):
        for j in range(n_):
            acc = 0.0 if b is None else b[j]
            for kk in range(k_):
                acc += x2[m, kk] * (w[kk, j] if transpose else w[j, kk])
            y[m, j] = acc
    return y.reshape(lead + (n_,))
