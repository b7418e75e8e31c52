"""The audit: what admission never saw (existing pods, workload templates, nodes' reports), judged by the
steps admission uses, and the PolicyReports that publish it.

`findings` judges a snapshot of the cluster (pure: plain dicts in, results out), `reports` shapes the results
as wgpolicyk8s.io PolicyReports and says which to write; `registrations` reads the mode each namespace gets
from the webhook configurations, `objects` holds the helpers over plain objects these and `doctor` share. The
replicas' audit (`service.auditor`) does the reading and writing; `doctor` reads the same findings.
"""
