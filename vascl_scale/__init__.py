"""vascl-scale: VaSCL and SimCSE sentence encoders trained over a global batch."""

__version__ = "0.1.0"
