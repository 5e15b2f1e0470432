"""Diagnostics that run the whole stack, so they live above it: cache drift against full
recomputation (``drift``) and kernel launches per decoder layer (``launches``)."""
