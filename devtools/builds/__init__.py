"""What the tooling builds once and caches: the control plane's binaries, the image, the wheel, OCI archives."""
