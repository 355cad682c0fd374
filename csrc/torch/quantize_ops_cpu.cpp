// CPU implementations of the quantize ops: thin wrappers over fp8ext::cpu.
#include <torch/library.h>

#include <tuple>

#include "fp8ext/quantize.h"
#include "quantize_outputs.h"
#include "tensor_checks.h"

namespace fp8ext::torch_ops {
namespace {

using QuantOut = std::tuple<at::Tensor, at::Tensor>;

at::Tensor cast_to_fp8_cpu(const at::Tensor& x, at::ScalarType dtype, bool saturate) {
  const ConstMatrix in = input_matrix(x, "x");
  const Fp8Format f = to_fp8_format(dtype, "dtype");
  at::Tensor q = new_fp8_output(x, dtype, in.cols);
  cpu::cast_to_fp8(in, output_matrix(q, f, in.cols), saturate);
  return q;
}

at::Tensor quantize_with_scale_cpu(const at::Tensor& x, const at::Tensor& scale,
                                   at::ScalarType dtype, int64_t pad_k_to) {
  const ConstMatrix in = input_matrix(x, "x");
  check_scalar_fp32(scale, "scale", x);
  const Fp8Format f = to_fp8_format(dtype, "dtype");
  at::Tensor q = new_fp8_output(x, dtype, padded_cols(in.cols, pad_k_to));
  cpu::quantize_with_scale(in, *scale.data_ptr<float>(), output_matrix(q, f, in.cols));
  return q;
}

QuantOut quantize_delayed_cpu(const at::Tensor& x, at::Tensor& amax_history, at::Tensor& scale,
                              at::ScalarType dtype, int64_t margin, bool power_of_two,
                              bool use_history_max, int64_t pad_k_to) {
  const ConstMatrix in = input_matrix(x, "x");
  const ScaleRule rule = scale_rule(dtype, margin, power_of_two);
  check_scalar_fp32(scale, "scale", x);
  check_amax_history(amax_history, x);
  check_delayed_state_apart(x, amax_history, scale);
  at::Tensor q = new_fp8_output(x, dtype, padded_cols(in.cols, pad_k_to));
  at::Tensor used = new_scalar_scale(x);
  cpu::quantize_delayed(in, rule, use_history_max, amax_history.data_ptr<float>(),
                        amax_history.numel(), scale.data_ptr<float>(),
                        output_matrix(q, rule.format, in.cols), used.data_ptr<float>());
  return {q, used};
}

// per-tensor current, per-row, per-group and per-block share one shape: allocate, run, return.
template <at::Tensor (*NewScales)(const at::Tensor&),
          void (*Run)(const ConstMatrix&, const ScaleRule&, const Fp8Matrix&, float*)>
QuantOut quantize_scaled_cpu(const at::Tensor& x, at::ScalarType dtype, int64_t margin, bool power_of_two,
                             int64_t pad_k_to) {
  const ConstMatrix in = input_matrix(x, "x");
  const ScaleRule rule = scale_rule(dtype, margin, power_of_two);
  at::Tensor q = new_fp8_output(x, dtype, padded_cols(in.cols, pad_k_to));
  at::Tensor s = NewScales(x);
  Run(in, rule, output_matrix(q, rule.format, in.cols), s.data_ptr<float>());
  return {q, s};
}

}  // namespace

TORCH_LIBRARY_IMPL(fp8ext, CPU, m) {
  m.impl("cast_to_fp8", &cast_to_fp8_cpu);
  m.impl("quantize_with_scale", &quantize_with_scale_cpu);
  m.impl("quantize_per_tensor", &quantize_scaled_cpu<new_scalar_scale, cpu::quantize_per_tensor>);
  m.impl("quantize_delayed", &quantize_delayed_cpu);
  m.impl("quantize_per_row", &quantize_scaled_cpu<new_row_scales, cpu::quantize_per_row>);
  m.impl("quantize_per_group", &quantize_scaled_cpu<new_group_scales, cpu::quantize_per_group>);
  m.impl("quantize_per_block", &quantize_scaled_cpu<new_block_scales, cpu::quantize_per_block>);
}

}  // namespace fp8ext::torch_ops
