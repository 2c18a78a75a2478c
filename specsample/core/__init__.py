"""The pure core: sampling parameters, `warp`, `sample`, counter-based uniforms, the
verification rules (token, block, tree), caches and the model/drafter protocols.

Functions over NumPy, torch or JAX arrays (the array API); no state, no I/O. Nothing here
imports the engine, the drafters or the tools.
"""
