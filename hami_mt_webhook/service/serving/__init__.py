"""The HTTP side: the webhook port (`server` > `endpoint`, `listener` and `tls` > `connections` > `http11`) and
the probe and metrics ports (`probes`), on listeners of our own."""
