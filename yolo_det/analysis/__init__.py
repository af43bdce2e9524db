"""Analysis: the op table, model loading, the fake-CUDA audit and the CPU alert emulator.

Decides (what breaks strict determinism, which modules to swap); never changes a model.
"""
