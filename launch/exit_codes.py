"""The exit codes every binary of this project ends with, and which are retried.

The contract between the trainers, the launcher (`launch.supervisor`) and the
tools: each imports it from here. The rule is Kubeflow's `ExitCode` restart
policy, so the local launcher and an orchestrator retry the same failures:
128 and above (a signal, 128 + its number, or a code chosen to be retried:
PEER_LOST, STARTUP_TIMEOUT, PREEMPTED) are retried; 1 to 127 are permanent.
"""

from typing import Dict

OK = 0
USAGE = 2  # Bad flags, TF_CONFIG, ports or model_dir: starting again cannot help.
DIVERGED = 3  # The loss or the weights became NaN or Inf: a restart would diverge again.
DISK_FULL = 4  # A write found no space left: a restart would fail the same way.
TIMEOUT = 124  # A local cluster ran past --timeout or stalled (as coreutils' timeout(1)).
# A task lost a training peer (dead, frozen, cut off): restarting the whole
# cluster resumes it. At or above 128, so Kubeflow's ExitCode policy retries
# it, and above every 128 + signal number, so it is told apart.
PEER_LOST = 200
# The cluster did not come up: a peer never listened within --startup_timeout,
# or listened but never joined. 128 + SIGALRM, the signal the start-up
# watchdog stops a task with, so both ways end with this one code; retried,
# since pods start late.
STARTUP_TIMEOUT = 142
# A task stopped by SIGTERM (a pod deleted, a node drained, a spot VM reclaimed) after
# its cluster saved the step it stopped at (trainers.preemption): 128 + SIGTERM, as a
# shell and Kubernetes report a SIGTERM, so it is retried everywhere. The local launcher
# restarts it without counting it against --max_restarts.
PREEMPTED = 143
# The same stop by SIGINT (Ctrl-C): 128 + SIGINT.
INTERRUPTED = 130

# Why the named codes below 128 are not retried; every other code below 128 is
# an error no code names (1: the message says which), not retried either.
NOT_RETRIED: Dict[int, str] = {
    USAGE: "a usage error is not retried",
    DIVERGED: "a diverged run is not retried (it would diverge again)",
    DISK_FULL: "a full disk is not retried (free space, then run the same command again)",
}
_UNNAMED = ("exit codes 1 to 127 are not retried: an orchestrator's ExitCode policy treats "
            "them as permanent; the task's log says what failed")


def retried(code: int) -> bool:
  """Whether `code` is retried: 128 and above (see the module docstring).

  `code` as a shell sees it: a task killed by signal N is 128 + N.
  """
  return code >= 128


def shell_code(returncode: int) -> int:
  """A process's exit code as a shell and an orchestrator see it, from its Popen return
  code (-N if signal N killed it): 128 + N for a signal."""
  return 128 - returncode if returncode < 0 else returncode


def why_not_retried(code: int) -> str:
  """Why a failure with `code` (1 to 127) is not retried, for the launcher's message."""
  return NOT_RETRIED.get(code, _UNNAMED)
