"""Drop-in FP8 modules and model conversion."""
from fp8ext.nn import auto  # noqa: F401
from fp8ext.nn.calibrate import CalibrationResult, calibrate
from fp8ext.nn.convert import ConversionSummary, convert
from fp8ext.nn.linear import FP8Linear

__all__ = ["FP8Linear", "convert", "ConversionSummary", "calibrate", "CalibrationResult"]
