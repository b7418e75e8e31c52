"""What the replica keeps of the cluster for reviews: the node view (`nodewatch` > `nodefeed`) and the quota
index (`quotawatch`), each fed by a `kube.watch.Watch`."""
