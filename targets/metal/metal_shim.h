/* metal_shim.h: enough of <metal_stdlib> to compile mconv's generated kernels as C++17 (g++/clang++).
 *
 * Used by the Linux harness only (no Metal compiler runs on Linux): kernels.metal is compiled
 * against this header and each kernel is called once per grid point, sequentially.
 *  - address-space qualifiers: `device`, `thread`, `threadgroup` vanish; `constant` becomes `const`
 *    (program-scope `constant int X = 3;` and `constant T*` pointers both stay valid C++);
 *  - `kernel` vanishes; attributes such as [[buffer(0)]] and [[thread_position_in_grid]] are
 *    ignored (the pragma silences g++'s -Wattributes);
 *  - `half` is `_Float16` (g++ 12, clang 15): the same IEEE binary16 storage as Metal's half;
 *  - uint3 and the metal:: math functions the generator uses, with precise:: and fast:: variants;
 *  - as_type<T>(x) (a bit cast), which IsNaN/IsInf use: they test bits, not float compares that
 *    Metal's fast math may fold away.
 */
#ifndef MCONV_METAL_SHIM_H
#define MCONV_METAL_SHIM_H

#pragma GCC diagnostic ignored "-Wattributes"
#pragma clang diagnostic ignored "-Wunknown-attributes"

#include <cmath>
#include <cstdint>
#include <cstring>

#define kernel
#define device
#define thread
#define threadgroup
#define constant const

typedef _Float16 half;
typedef unsigned int uint;

/* MSL's as_type<T>(x): the bits of x read as a T of the same size. */
template <typename T, typename F>
inline T as_type(F x) {
    static_assert(sizeof(T) == sizeof(F), "as_type between types of different sizes");
    T t;
    std::memcpy(&t, &x, sizeof t);
    return t;
}

struct uint3 {
    uint x, y, z;
};

namespace metal {
inline float exp(float x) { return std::exp(x); }
inline float log(float x) { return std::log(x); }
inline float tanh(float x) { return std::tanh(x); }
inline float sqrt(float x) { return std::sqrt(x); }
inline float rsqrt(float x) { return 1.0f / std::sqrt(x); }
inline float pow(float x, float y) { return std::pow(x, y); }
inline float fabs(float x) { return std::fabs(x); }
inline float abs(float x) { return std::fabs(x); }
inline float floor(float x) { return std::floor(x); }
inline float ceil(float x) { return std::ceil(x); }
inline float rint(float x) { return std::rint(x); }
inline float sin(float x) { return std::sin(x); }
inline float cos(float x) { return std::cos(x); }
inline float fmod(float x, float y) { return std::fmod(x, y); }
inline bool isinf(float x) { return std::isinf(x); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline float min(float a, float b) { return std::fmin(a, b); }
inline int max(int a, int b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
namespace precise {
using metal::exp;
using metal::log;
using metal::pow;
using metal::rsqrt;
using metal::sqrt;
using metal::tanh;
}  // namespace precise
namespace fast {
using metal::exp;
using metal::log;
using metal::pow;
using metal::rsqrt;
using metal::sqrt;
using metal::tanh;
}  // namespace fast
}  // namespace metal

#endif
