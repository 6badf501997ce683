/* The dispatch block every caffe8 host-kernel library shares (layers/csrc/layer_kernels.c,
 * solvers/csrc/solver_kernels.c, comm/csrc/kernels.c), so that it is written once.
 *
 * The libraries are plain C99 shared libraries (no Python C API) loaded with ctypes, which
 * releases the GIL for each call. They are built without -march, so one build runs on any
 * x86-64: a loop that gains from wider vectors says so itself.
 *
 *   KERNEL        compiles a function twice, for AVX2 and for the baseline, and the loader (an
 *                 ifunc) picks one by CPU (target_clones; nothing where the compiler or the
 *                 platform lacks it);
 *   C8_X86        1 on x86 with GCC-style builtins: function-level target attributes, CPUID and
 *                 the intrinsics headers may be used (comm/csrc/kernels.c's AVX-512 and
 *                 AVX2 + F16C paths, chosen at run time);
 *   idx           the signed size type of array lengths and strides (ptrdiff_t, int64 on every
 *                 platform caffe8 builds on; ctypes passes c_ssize_t);
 *   C8_ABI(fn, v) defines ``int fn(void)`` returning v: the version the Python side checks
 *                 before it trusts a library (engine/native.py's load_library).
 *
 * Found by the compiler through -I: setup.py gives engine/csrc as an include directory, and
 * engine/native.py's run-time build passes this folder; it is installed with the package sources
 * (package_data), and a build's cache key includes it.
 */
#ifndef C8_KERNELS_H
#define C8_KERNELS_H

#include <stddef.h>

#if defined(__x86_64__) && defined(__linux__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define KERNEL __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef KERNEL
#define KERNEL
#endif

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define C8_X86 1
#else
#define C8_X86 0
#endif

typedef ptrdiff_t idx;

#define C8_ABI(fn, version) int fn(void) { return (version); }

#endif /* C8_KERNELS_H */
