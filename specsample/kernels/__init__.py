"""Compiled host passes behind the warp (numba), dispatched by `dispatch`, with the
histogram layout they share (`layout`) and the array-library selection they stand in for
(`select`, whose sort is the readable reference)."""
