"""Tests of server.py's stop handling.

  .deps/bench-venv/bin/python -m unittest discover -s bench/python -p 'test_*.py'
"""

import os
import subprocess
import sys
import textwrap
import threading
import time
import unittest

import server

HERE = os.path.dirname(os.path.abspath(__file__))


class StopRequestTest(unittest.TestCase):
    def test_signals_while_waiting(self):
        """SIGTERM arriving over and over while the main thread waits,
        handled wherever it lands: the waiting ends with the stop seen. A
        threading.Event set by the handler deadlocked under this load (its
        lock held by the interrupted Event.wait) within seconds. In a child
        process, so that a deadlock fails the test instead of hanging it."""
        code = textwrap.dedent("""
            import signal, sys, threading, time
            sys.path.insert(0, sys.argv[1])
            import server
            stop = server.StopRequest()
            stop.install()
            done = False
            def sender():
                me = threading.get_ident()
                while not done:
                    # To this thread, so the main thread's handler runs
                    # at its next bytecode boundary, wherever that is.
                    signal.pthread_kill(me, signal.SIGTERM)
                    time.sleep(0.0002)
            threading.Thread(target=sender, daemon=True).start()
            seen = 0
            end = time.monotonic() + 3
            while time.monotonic() < end:
                seen += stop.wait(0)
            done = True
            print("waits that saw the stop:", seen)
        """)
        try:
            out = subprocess.run([sys.executable, "-c", code, HERE], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired as e:
            self.fail(f"the waiting process deadlocked under signals: {e}")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("waits that saw the stop:", out.stdout)
        self.assertGreater(int(out.stdout.split(":")[1]), 0, out.stdout)

    def test_set_from_another_thread(self):
        stop = server.StopRequest()
        self.assertFalse(stop.wait(0))
        threading.Timer(0.05, stop.set).start()
        start = time.monotonic()
        while not stop.wait(0.01):
            self.assertLess(time.monotonic() - start, 10, "set() from another thread was never seen")


if __name__ == "__main__":
    unittest.main()
