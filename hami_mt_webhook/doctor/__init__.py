"""`hami-mt-webhook doctor`: read-only checks of a live cluster, each finding saying what to do.

`checks` holds the checks, pure functions over the objects read (plain dicts); `fetch` does the reading
(the API server, and a TLS handshake with the webhook to see the certificate it serves).
"""
