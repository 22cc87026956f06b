"""Native CPU kernels (C, runtime CPU dispatch, a scalar fallback) for products over GGUF blocks as stored.

The layer below the model: `native` binds the compiled library (csrc/), `linear` wraps it as a module.
"""
