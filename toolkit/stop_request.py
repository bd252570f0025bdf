"""Ctrl-C and SIGTERM during training, turned into a request to stop that the training loop honours
at a point where it can save: after a step, after a save, or at once in a phase that may be
abandoned (the dev decode)."""
import contextlib
import os
import signal
import sys


class StopRequest:
    """While in its `with` block, turns SIGINT and SIGTERM into a request to stop, acknowledged at
    once with one line on stderr that says what is being finished: the training loop checks it after
    each step, a save is finished, and a phase run `with stop.phase(what, abandon=True)` (the dev
    decode) is abandoned at once (StopNow). The previous handlers come back afterwards."""

    def __enter__(self):
        self.signal, self.signum, self._doing = None, None, ("finishing the current step", False)
        self._previous = {sig: signal.signal(sig, self._handle) for sig
                          in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc_info):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    @contextlib.contextmanager
    def phase(self, doing, abandon=False):
        """Within the block, a stop request says `doing` ("finishing the checkpoint being saved")
        and, with abandon, raises StopNow where the block is."""
        previous, self._doing = self._doing, (doing, abandon)
        try:
            if abandon and self.signal:
                raise StopNow()
            yield
        finally:
            self._doing = previous

    def exit_code(self):
        """128 + the number of the signal received (130 for SIGINT, 143 for SIGTERM), 0 without
        one."""
        return 128 + self.signum if self.signum else 0

    def _handle(self, signum, frame):
        doing, abandon = self._doing
        if self.signal is None:
            os.write(sys.stderr.fileno(),
                     ("%s: %s, then stopping\n" % (signal.Signals(signum).name, doing)).encode())
        self.signal, self.signum = signal.Signals(signum).name, signum
        if abandon:
            raise StopNow()


class StopNow(KeyboardInterrupt):
    """A stop request that abandons the phase it came in (see StopRequest.phase); a
    KeyboardInterrupt, so that no `except Exception` takes it for the phase's failure."""
