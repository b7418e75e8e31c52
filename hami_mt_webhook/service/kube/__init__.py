"""Reaching kube-apiserver: the one client (`client`: login, session, client-go's retry rule), the watch every
view is fed by (`watch`), and the Lease that picks one replica (`lease`)."""
