"""PID 1 of a simulated host (tests/multinode/run.sh): reaps the orphans that the
host's processes leave (Open MPI's daemons re-parent their children), so that no
zombies pile up, and sits otherwise. It ends on SIGTERM or when killed, and the
kernel then ends every process of the host's PID namespace with it.

    python3 pid1.py READY_FILE   # touches READY_FILE once it reaps
"""

import os
import signal
import sys
import time


def main() -> None:
    # PID 1 gets no default signal actions: without a handler SIGTERM is ignored.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    with open(sys.argv[1], "w"):
        pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            time.sleep(0.2)  # no children now; wait for the next orphan
        except InterruptedError:
            pass


if __name__ == "__main__":
    main()
