"""The operator's entry points: the Pythonic API (validate, plan, run an engine, wrap), the
C-style two-phase mirror (aclnn), the recompute mode, and torch tensors as NumPy views with
torch's GEMMs as a back end. Torch is used where the caller brings it, never imported here."""
