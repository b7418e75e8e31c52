"""Scenarios run on a cluster: faults, certificate renewals, every Kubernetes minor."""
