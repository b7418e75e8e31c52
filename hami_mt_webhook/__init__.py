"""HAMi's admission rules for Moore Threads sGPU slices, served as a Kubernetes webhook."""

__version__ = "0.1.0"

__all__ = ["__version__"]
