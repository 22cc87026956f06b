"""`verispec serve --replicas N`: the server's engine as N Ray Serve replicas behind one ingress (docs/cluster.md).

- prefix.py: the prompt-prefix keys requests are routed by (no Ray needed);
- router.py: the request router (Ray Serve's extension point): the replica holding the prefix, else the less
  loaded of two random replicas;
- replica.py: one engine replica, which answers with the single-process app itself;
- ingress.py: the one HTTP entry: the guard, forwarding with retries, merged /metrics;
- launch.py: starting or joining Ray and deploying the application.
"""
