"""The ``local`` backend: each sandbox made of Linux namespaces on this host (bubblewrap).

``backend.py`` is the sandbox (``LocalSandbox``); ``rootfs.py`` the read-only system it sees;
``egress.py`` its way out when it has network (a user-mode stack in its own namespace);
``zygote.py`` fresh sandboxes forked from one started once (the grading zygote's host side).
What the docker backend shares with it (the init, uids, cgroups, volumes, the file API) is in
the package above.
"""
