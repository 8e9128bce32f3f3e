"""naiad's version, in a module of its own: what the offline tools stamp into what they write
(manifests) reads it without importing the whole package."""

__version__ = "0.1.0"
