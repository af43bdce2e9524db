"""Tools built on the integrations: verify, bench, fingerprints, demo data, CLI-argument helpers."""
