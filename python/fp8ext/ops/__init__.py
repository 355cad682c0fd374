"""torch.ops.fp8ext: fake (meta) implementations and reference paths of the native ops."""
from fp8ext.ops import fake, fused, gemm_reference, kv_cache_reference, reference  # noqa: F401
from fp8ext.ops import cuda_fallback  # noqa: F401
