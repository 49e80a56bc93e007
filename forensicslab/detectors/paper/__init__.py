"""Adapters for the seven published detectors of the triage paper's pool, each proven against its authors' code by a golden fixture."""
