"""edgec: profile, split, compile and benchmark dynamic models for edge devices."""

__version__ = "0.1.0"
