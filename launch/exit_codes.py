"""The exit codes every binary of this project ends with, and which a launcher retries.

The contract between the trainers, the launcher (`launch.supervisor`) and the
tools: each imports it from here. Kubeflow's `ExitCode` restart policy retries
128 and above (a signal, or a code chosen to be retried: PEER_LOST) and treats
1 to 127 as permanent. The local launcher also retries 1 (an error no code
names), but never NOT_RETRIED. Codes a later feature needs (a preempted task, a
cluster that did not come up) go here, with whether they are retried.
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

# Why the codes below 128 that a failed task can end with are not retried.
NOT_RETRIED: Dict[int, str] = {
    USAGE: "a usage error is not retried",
    DIVERGED: "a diverged run is not retried (it would diverge again)",
    DISK_FULL: "a full disk is not retried (free space, then run the same command again)",
}


def retried(code: int) -> bool:
  """Whether a launcher starts a task that ended with `code` again (restarts permitting).

  Today the local launcher retries every failure but the NOT_RETRIED ones;
  the README's exit-code table says which each code is.
  """
  return code != OK and code not in NOT_RETRIED
