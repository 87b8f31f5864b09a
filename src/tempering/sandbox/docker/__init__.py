"""The ``docker`` backend: each sandbox a container on a real Docker Engine.

``backend.py`` is the sandbox (``DockerSandbox``); ``api.py`` a small client of the Docker
Engine API over its unix socket (``DockerAPI``); ``image.py`` the default image, built from this
host's own packages; ``bridge.py`` the network of a sandbox with ``network=True``. The
container's PID 1 is the same init as a local sandbox's, and its files are reached through the
same confined file API (the package above).
"""
