"""Built-in determinism profiles (package data: ``repro.yaml``, ``balanced.yaml``, ``fast.yaml``)."""
