"""The histogram layout and sampling constants that the top-p passes share.

`specsample.kernels.select` (NumPy and torch) and `specsample.kernels.compiled` (numba)
bucket a row by the same bits and place their candidate level from a strided sample of
it; the strides differ because the two passes trade the sample's cost differently.
"""

from __future__ import annotations

__all__ = ["BUCKETS", "COMPILED_STRIDE", "LANES", "MARGIN", "SHIFT", "STRIDE"]

# Histogram buckets: the top 12 bits of a float32 (sign, exponent, 3 mantissa bits); every
# value in [0, 2) falls in [0, 4096), ordered as the non-negative values are. float64 is
# rounded to float32 first (rounding keeps the order).
BUCKETS = 1 << 12
SHIFT = 32 - 12
# Every STRIDE-th entry of a row is the sample that places a top-p candidate level: the
# highest at which the sampled mass below it plus MARGIN of its standard errors stays under
# 1 - top_p, so the candidates are few beyond the kept ones. The array libraries' pass
# (`select`) samples every 16th entry; the compiled pass, which reads the whole row anyway,
# every 32nd (COMPILED_STRIDE).
STRIDE = 16
COMPILED_STRIDE = 32
MARGIN = 4.0
# Entries of the widest vector `specsample.kernels.compiled.packed` packs (16 float32 in 64 bytes).
LANES = 16
