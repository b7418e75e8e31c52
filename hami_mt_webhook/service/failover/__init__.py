"""Failover: the replicas probe each other (`peers`) and judge who is silent (`peerview`, pure)."""
