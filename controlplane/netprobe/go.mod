// The probe pods of the node tier's NetworkPolicy checks (devtools/netpol.py builds it FROM scratch).
module hami-mt-webhook/netprobe

go 1.22
