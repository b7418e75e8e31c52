// The pod sandbox's process of the node tier (devtools/clusters/node.py builds it FROM scratch).
module hami-mt-webhook/pause

go 1.22
