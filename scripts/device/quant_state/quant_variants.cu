// Where static quantization's time goes, outside the library: fp8ext's own
// chunk code (quant_common.cuh: unpack, fast_quotient division, saturating
// encode) against a plain multiply-and-convert, each under two traversals:
//   flat: a persistent grid (blocks_per_sm x SMs) striding over the tensor's
//         16-element chunks as one array;
//   rows: the library's kernel shape (blocks walk rows along y, 2 rows a step,
//         chunks along x, __launch_bounds__(256, 4)) with several grid heights.
//         The library's grid was 2 x 1024 here (16 blocks per SM in all) when
//         these ran; it is 2 x 2048 (32) since. The ctypes entry points below
//         time the 2 x 1024 grid, as measured in session 13.
// 16384 x 8192 bf16 -> E4M3, times of 20 back-to-back calls. From the
// repository root (with -shared -Xcompiler -fPIC -DQV_LIBRARY -o /tmp/libqv.so
// instead of -o /tmp/qv: the library that the diag_*.py scripts load):
//   nvcc -O3 -std=c++17 -arch=sm_90a -I csrc/include -I csrc/quant -o /tmp/qv scripts/device/quant_state/quant_variants.cu
#include <algorithm>
#include <cstdio>

#include "diag_timing.cuh"
#include "quant_common.cuh"

using namespace fp8ext;
using namespace fp8ext::cuda::detail;
using T = __nv_bfloat16;


template <bool kOurs>
__device__ __forceinline__ Codes encode(const float (&v)[kChunk], const Scale& scale) {
  if constexpr (kOurs) {
    return quantize_chunk<Fp8Format::kE4M3>(v, scale);
  } else {
    Codes q;
#pragma unroll
    for (int j = 0; j < kChunk; j += 2) {
      const __nv_fp8x2_storage_t p =
          __nv_cvt_float2_to_fp8x2(make_float2(v[j] * scale.r, v[j + 1] * scale.r), __NV_SATFINITE, __NV_E4M3);
      q.bytes[j] = p & 0xFF;
      q.bytes[j + 1] = p >> 8;
    }
    return q;
  }
}

template <bool kOurs, int kMinBlocks>
__global__ void __launch_bounds__(256, kMinBlocks) flat(Input<T> in, Output out, int64_t units, const float* s) {
  const Scale scale(*s);
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < units; t += int64_t(gridDim.x) * blockDim.x) {
    typename Input<T>::Raw raw;
    raw.words[0] = __ldcs(reinterpret_cast<const uint4*>(in.data) + 2 * t);
    raw.words[1] = __ldcs(reinterpret_cast<const uint4*>(in.data) + 2 * t + 1);
    float v[kChunk];
    Input<T>::unpack(raw, v);
    __stcs(reinterpret_cast<uint4*>(out.data) + t, encode<kOurs>(v, scale).vec);
  }
}

template <bool kOurs>
__global__ void __launch_bounds__(256, 4) rows(Input<T> in, Output out, int64_t chunks_per_row, const float* s) {
  constexpr int N = 2;
  const Scale scale(*s);
  const int64_t step = gridDim.y;
  for (int64_t r = blockIdx.y; r < in.rows; r += N * step)
    for (int64_t c = blockIdx.x * int64_t{256} + threadIdx.x; c < chunks_per_row; c += int64_t{gridDim.x} * 256) {
      typename Input<T>::Raw raw[N];
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (r + i * step < in.rows) in.load_raw(r + i * step, c * kChunk, raw[i]);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        if (r + i * step >= in.rows) break;
        float v[kChunk];
        in.unpack(raw[i], v);
        out.store(r + i * step, c * kChunk, encode<kOurs>(v, scale));
      }
    }
}

#ifndef QV_LIBRARY
int main() {
  const int64_t m = 16384, k = 8192, n = m * k, chunks = k / kChunk;
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  T* x; uint8_t* q; float* s;
  CHECK(cudaMalloc(&x, n * 2)); CHECK(cudaMalloc(&q, n)); CHECK(cudaMalloc(&s, 4));
  CHECK(cudaMemset(x, 0x3c, n * 2));  // 0x3c3c as bf16: 0.0115, a normal value
  const float scale = 0.05f;
  CHECK(cudaMemcpy(s, &scale, 4, cudaMemcpyHostToDevice));
  const Input<T> in{x, m, k, k, true};
  const Output out{q, m, k, k, true};
  auto report = [&](const char* name, float us) { printf("%-34s %6.1f us  %.3f TB/s\n", name, us, 3.0 * n / us / 1e6); };
  for (int b : {4, 8}) {
    char name[64];
    snprintf(name, sizeof name, "flat multiply, %d blocks/SM", b);
    report(name, time_us([&] { flat<false, 1><<<sms * b, 256>>>(in, out, n / kChunk, s); }));
    snprintf(name, sizeof name, "flat fp8ext chunk, %d blocks/SM", b);
    report(name, time_us([&] { flat<true, 1><<<sms * b, 256>>>(in, out, n / kChunk, s); }));
    snprintf(name, sizeof name, "flat fp8ext chunk lb4, %d blocks/SM", b);
    report(name, time_us([&] { flat<true, 4><<<sms * b, 256>>>(in, out, n / kChunk, s); }));
  }
  for (int gy : {264, 528, 1024, 2048}) {  // the library's grid is 2 x 1024 here
    char name[64];
    snprintf(name, sizeof name, "rows multiply, grid 2x%d", gy);
    report(name, time_us([&] { rows<false><<<dim3(2, gy), 256>>>(in, out, chunks, s); }));
    snprintf(name, sizeof name, "rows fp8ext chunk, grid 2x%d", gy);
    report(name, time_us([&] { rows<true><<<dim3(2, gy), 256>>>(in, out, chunks, s); }));
  }
  CHECK(cudaGetLastError()); CHECK(cudaDeviceSynchronize());
  return 0;
}
#endif

// For diag_replica.py: the same kernels driven from a Python process (ctypes),
// on torch's tensors or on buffers of their own. Build with -shared -Xcompiler -fPIC -DQV_LIBRARY.
extern "C" int qv_rows(const void* x, void* q, const float* s, int64_t m, int64_t k, int gy, int ours) {
  const Input<T> in{static_cast<const T*>(x), m, k, k, true};
  const Output out{static_cast<uint8_t*>(q), m, k, k, true};
  if (ours)
    rows<true><<<dim3(2, gy), 256>>>(in, out, k / kChunk, s);
  else
    rows<false><<<dim3(2, gy), 256>>>(in, out, k / kChunk, s);
  return static_cast<int>(cudaGetLastError());
}

extern "C" void* qv_malloc(int64_t bytes) {
  void* p = nullptr;
  return cudaMalloc(&p, bytes) == cudaSuccess ? p : nullptr;
}

extern "C" int qv_copy(void* dst, const void* src, int64_t bytes) {
  return static_cast<int>(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}

// The replica's buffers, allocated fresh (x filled with 0x3c3c: bf16 0.0115;
// s = 0.05) and freed on scope exit. ok is false where an allocation failed.
struct OwnBuffers {
  static constexpr int64_t m = 16384, k = 8192, n = m * k;
  T* x = nullptr;
  uint8_t* q = nullptr;
  float* s = nullptr;
  bool ok = false;
  OwnBuffers() {
    ok = cudaMalloc(&x, n * 2) == cudaSuccess && cudaMalloc(&q, n) == cudaSuccess && cudaMalloc(&s, 4) == cudaSuccess;
    if (!ok) return;
    const float scale = 0.05f;
    ok = cudaMemset(x, 0x3c, n * 2) == cudaSuccess && cudaMemcpy(s, &scale, 4, cudaMemcpyHostToDevice) == cudaSuccess;
  }
  ~OwnBuffers() { cudaFree(x); cudaFree(q); cudaFree(s); }
  void launch() const {
    rows<true><<<dim3(2, 1024), 256>>>(Input<T>{x, m, k, k, true}, Output{q, m, k, k, true}, k / kChunk, s);
  }
};

// The whole timing in C (own buffers, own events): what does the host process
// around it change? (diag_process_state.py)
extern "C" float qv_time_rows_own_buffers() {
  const OwnBuffers b;
  if (!b.ok) return -1.0f;
  const float us = time_us([&] { b.launch(); });
  return cudaGetLastError() == cudaSuccess ? us : -1.0f;
}

// One call at a time, each queued behind a ~0.5 ms spin so the launch is
// ready before the GPU gets to it (benchlib.time_ms's way); median of 20.
extern "C" float qv_time_rows_isolated() {
  const OwnBuffers buf;
  if (!buf.ok) return -1.0f;
  cudaEvent_t a, b;
  cudaEventCreate(&a); cudaEventCreate(&b);
  float t[20];
  for (int i = 0; i < 25; ++i) {
    spin<<<1, 1>>>(1000000);
    cudaEventRecord(a);
    buf.launch();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    if (i >= 5) cudaEventElapsedTime(&t[i - 5], a, b);
  }
  std::sort(t, t + 20);
  cudaEventDestroy(a); cudaEventDestroy(b);
  return cudaGetLastError() == cudaSuccess ? t[10] * 1e3f : -1.0f;
}

// Back-to-back time on given buffers (x holds bf16, s one float).
extern "C" float qv_time_rows_on(const void* x, void* q, const float* s, int64_t m, int64_t k) {
  const Input<T> in{static_cast<const T*>(x), m, k, k, true};
  const Output out{static_cast<uint8_t*>(q), m, k, k, true};
  return time_us([&] { rows<true><<<dim3(2, 1024), 256>>>(in, out, k / kChunk, s); });
}

// Fresh buffers after a `pad_mb` allocation held during the timing: does the
// buffers' place in memory matter? Prints the addresses.
extern "C" float qv_time_rows_after_pad(int64_t pad_mb) {
  void* pad = nullptr;
  if (pad_mb > 0 && cudaMalloc(&pad, pad_mb << 20) != cudaSuccess) return -1.0f;
  float us = -1.0f;
  {
    const OwnBuffers b;
    if (b.ok) {
      us = time_us([&] { b.launch(); });
      printf("  pad %4lld MB: x %p q %p: %.1f us\n", static_cast<long long>(pad_mb), static_cast<void*>(b.x),
             static_cast<void*>(b.q), us);
      fflush(stdout);
    }
  }
  if (pad) cudaFree(pad);
  return us;
}

// n launches from C, no timing: the caller times them with its own events.
extern "C" int qv_launch_rows_n(const void* x, void* q, const float* s, int64_t m, int64_t k, int n) {
  const Input<T> in{static_cast<const T*>(x), m, k, k, true};
  const Output out{static_cast<uint8_t*>(q), m, k, k, true};
  for (int i = 0; i < n; ++i) rows<true><<<dim3(2, 1024), 256>>>(in, out, k / kChunk, s);
  return static_cast<int>(cudaGetLastError());
}
