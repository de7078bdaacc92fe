"""Shared library of the Direct-OPD campaign: each module is small, pure where it can be, and tested."""
