"""The one number every hang guard of the tests comes from (tests/README.md, "Hang guards").

A hang guard turns a hang into a failure: the timeout of a child process a test waits for, the
deadline of a loop polling for a marker file, the gloo/NCCL or TCPStore timeout of a collective a
child process waits in. It is never a measurement, so it must not trip on a healthy run however
slow the machine: under `make test` beside other work on 2 cores (load 4-7) a 60 s gloo timeout
in a rollout rank, tripped while its training ranks were still starting, failed a healthy case
(issue 61). So every guard is one of these, never a literal (tests/test_hang_guards.py checks):

- `HANG_GUARD_S`, 30 min: a test's wait on a child process or on a polled condition. The
  longest single wait measured in the default suite took 84 s at load 11 on the 2-core VM (two
  ranks of test_uniform_head_calls; preset=tiny end to end 60-77 s): the guard is over 20x that,
  and still ends a real hang within the hour.
- `CHILD_GUARD_S`, half of it: a wait inside a child process (a collective, a store, a poll), so
  that the child's own error, naming what it waited for, comes before the test gives up on it.
  `COLLECTIVE_GUARD` is the same as a timedelta, `COLLECTIVE_GUARD_MIN` in minutes (for
  `actor.collective_timeout_min=` and `cluster.bridge_timeout_min=` overrides).

A slow (`-m slow`) case that runs for longer than a few minutes alone waits a stated multiple of
`HANG_GUARD_S`. `SPARROW_TEST_HANG_GUARD_S` (seconds) replaces the 30 min: larger on a much slower
machine, smaller to see a planted hang fail quickly; child processes inherit it.

Timeouts that a test is *about* (a reward's `timeout_s`, the 3 s process group whose expiry
`lost_peer` must recognise) are not hang guards and stay literal beside what they test.
"""

import os
from datetime import timedelta

HANG_GUARD_S = float(os.environ.get("SPARROW_TEST_HANG_GUARD_S", "1800"))
CHILD_GUARD_S = HANG_GUARD_S / 2
COLLECTIVE_GUARD = timedelta(seconds=CHILD_GUARD_S)
COLLECTIVE_GUARD_MIN = CHILD_GUARD_S / 60
