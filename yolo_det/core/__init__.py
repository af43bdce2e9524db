"""Core: errors, files, constants, profiles, process state, seeding, the backward toggle and the run record.

The lowest layer: imports nothing of yolo_det above it.
"""
