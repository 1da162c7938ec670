"""Moves the process that imports it into a process group of its own.

Only the reward pool's fork server imports it, as its first preload (``deadline.pool``): the
server, and every worker it forks, then leave the controller's group, so a SIGINT or SIGTERM
sent to that group (Ctrl-C, ``timeout``, a batch scheduler's time limit) reaches the controller,
which finishes its step (``controller.stop_request``), and not the workers the step still needs.
They still end with the controller: the server exits when its "alive" pipe closes and takes its
workers along (``PR_SET_PDEATHSIG``).
"""

import os

if os.getpid() != os.getsid(0):  # a session leader cannot change its group (and has none to leave)
    os.setpgid(0, 0)
