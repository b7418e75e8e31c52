// The pod sandbox's process of the node tier (devtools/clusters/host.py builds it FROM scratch).
module hami-mt-webhook/pause

go 1.22
