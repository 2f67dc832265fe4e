"""Scanflow: autonomic MLOps."""
__version__ = "0.1.0"
