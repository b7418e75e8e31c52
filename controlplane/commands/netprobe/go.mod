// The probe pods of the node tier's NetworkPolicy checks (devtools/clusters/netpol.py builds it FROM scratch).
module hami-mt-webhook/netprobe

go 1.22
