"""The stream worker: the only package (with the tools built on it) that imports faust and
aiokafka. ``app.py`` wires it; ``kafka/`` is the Kafka plumbing and the catalogue of topics,
``scoring/`` and ``labels/`` the two paths, ``models/`` what a worker serves, ``health/``
whether it is well (``docs/reference/architecture.md`` draws the layers)."""
