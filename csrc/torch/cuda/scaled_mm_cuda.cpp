// The CUDA scaled_mm op: argument checks, the padded path for shapes the
// kernels cannot take directly, and the call into the CUTLASS kernels
// (csrc/gemm). Built only with the sm_90a GEMMs (FP8EXT_WITH_SM90_GEMM).
#ifdef FP8EXT_WITH_SM90_GEMM

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>

#include "../tensor_checks.h"
#include "cuda_status.h"
#include "gemm_operands.h"
#include "fp8ext/scaled_mm.h"

namespace fp8ext::torch_ops {
namespace {

using cuda::GemmConfig;

// Per-tensor (one value) or one per row of its operand; returns (contiguous fp32 scale, is_vector).
std::pair<at::Tensor, bool> check_scale(const at::Tensor& s, int64_t rows, const char* name,
                                        const char* operand, const at::Tensor& like) {
  TORCH_CHECK_TYPE(s.scalar_type() == at::kFloat, name, " must be float32, got ", s.scalar_type());
  TORCH_CHECK_VALUE(s.device() == like.device(), name, " must be on ", like.device(), ", got ", s.device());
  const bool one = s.numel() == 1;
  TORCH_CHECK_VALUE(one || (s.numel() == rows && (s.dim() == 1 || (s.dim() == 2 && (s.size(0) == 1 ||
                                                                                     s.size(1) == 1)))),
                    name, " must hold one value (per-tensor) or one per row of ", operand, " (", rows,
                    "), got shape ", s.sizes());
  return {s.reshape({-1}).contiguous(), !one};
}

cudaError_t launch(const cuda::ScaledMmProblem& p, int64_t config, const at::Tensor& like) {
  const auto cfg = static_cast<GemmConfig>(config);
  const size_t bytes = cuda::scaled_mm_workspace_bytes(p, cfg);
  at::Tensor workspace = at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
  return cuda::scaled_mm(p, cfg, bytes ? workspace.data_ptr() : nullptr, bytes,
                         c10::cuda::getCurrentCUDAStream(like.get_device()).stream());
}

at::Tensor scaled_mm_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                          const at::Tensor& scale_b, const std::optional<at::Tensor>& bias,
                          at::ScalarType out_dtype, int64_t config, bool use_fast_accum) {
  const Fp8Format fa = to_fp8_format(a.scalar_type(), "a");
  const Fp8Format fb = to_fp8_format(b.scalar_type(), "b");
  check_gemm_operands(a, b, out_dtype);
  TORCH_CHECK_VALUE(config >= 0 && config <= static_cast<int64_t>(GemmConfig::kLastConfig),
                    "config must be 0 (auto) to ", static_cast<int>(GemmConfig::kLastConfig), ", got ", config);
  const int64_t m = a.size(0), n = b.size(0), k = a.size(1);
  auto [sa, sa_vec] = check_scale(scale_a, m, "scale_a", "a", a);
  auto [sb, sb_vec] = check_scale(scale_b, n, "scale_b", "b", a);
  check_bias_and_gpu(bias, n, out_dtype, a, "fp8ext.scaled_mm");
  c10::cuda::CUDAGuard guard(a.device());

  at::Tensor out = at::empty({m, n}, a.options().dtype(out_dtype));
  if (m == 0 || n == 0) return out;
  if (k == 0) return bias ? out.copy_(bias->unsqueeze(0).expand({m, n})) : out.zero_();

  // E5M2 operands run with fp32 output (and E5M2 x E4M3 as D^T = B A^T), then
  // the bias and the cast follow: a rare, slower path.
  const bool direct = fa == Fp8Format::kE4M3 && fb == Fp8Format::kE4M3;
  const bool swap = fa == Fp8Format::kE5M2 && fb == Fp8Format::kE4M3;
  const at::ScalarType kernel_dtype = direct ? out_dtype : at::kFloat;
  const int64_t k16 = round_up(k, 16);
  const int64_t km = swap ? n : m, kn = swap ? m : n;
  // The TMA store needs N (the kernel's, the contiguous extent of D) and D's
  // row stride in whole 16 bytes: otherwise the kernel's B rows, its per-row
  // scale and the bias are zero-padded to that N and D is written to a buffer.
  const int64_t kn16 = round_up(kn, 16 / static_cast<int64_t>(at::elementSize(kernel_dtype)));
  const at::Tensor ka = kernel_operand(swap ? b : a, k16, km);
  const at::Tensor kb = kernel_operand(swap ? a : b, k16, kn16);
  const at::Tensor row_scale = swap ? sb : sa;
  const bool row_vec = swap ? sb_vec : sa_vec;
  const bool col_vec = swap ? sa_vec : sb_vec;
  const at::Tensor col_scale = col_vec ? padded_vector(swap ? sa : sb, kn16) : (swap ? sa : sb);
  const bool fused_bias = bias.has_value() && !swap && kernel_dtype == out_dtype;
  const at::Tensor kbias = fused_bias ? padded_vector(*bias, kn16) : at::Tensor();
  at::Tensor d = (kn16 == kn && kernel_dtype == out_dtype && !swap)
                     ? out
                     : at::empty({km, kn16}, a.options().dtype(kernel_dtype));
  cuda::ScaledMmProblem p{ka.data_ptr(), swap ? fb : fa, ka.size(0) <= 1 ? k16 : ka.stride(0),
                          kb.data_ptr(), swap ? fa : fb, kb.size(0) <= 1 ? k16 : kb.stride(0),
                          km, kn16, k16,
                          row_scale.data_ptr<float>(), row_vec,
                          col_scale.data_ptr<float>(), col_vec,
                          fused_bias ? kbias.data_ptr() : nullptr, d.data_ptr(), to_dtype(d, "out"), kn16,
                          use_fast_accum};
  if (const char* why = cuda::scaled_mm_unsupported_reason(p)) TORCH_CHECK_VALUE(false, "fp8ext.scaled_mm: ", why);
  TORCH_CHECK_VALUE(cuda::scaled_mm_has_config(p, static_cast<GemmConfig>(config)), "fp8ext.scaled_mm: config ",
                    cuda::gemm_config_name(static_cast<GemmConfig>(config)),
                    " is not instantiated for these operand formats and output dtype (use auto)");
  const cudaError_t err = launch(p, config, a);
  check_gemm_status(err, "fp8ext.scaled_mm: kernel launch");

  if (d.data_ptr() == out.data_ptr()) return out;
  // D's padded columns are dropped by torch's copy: copy_zero_padded stores 2
  // bytes at a time, 16 apart, into rows of odd N and was slower there
  // (4096x14335x4100 bf16: 814 against 767 us for the whole op, H100, session 46).
  at::Tensor result = d.narrow(1, 0, kn);
  if (swap) result = result.t();
  if (bias && !fused_bias) result = result + bias->to(at::kFloat);
  out.copy_(result);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fp8ext, CUDA, m) { m.impl("scaled_mm", &scaled_mm_cuda); }

}  // namespace fp8ext::torch_ops

#endif  // FP8EXT_WITH_SM90_GEMM
