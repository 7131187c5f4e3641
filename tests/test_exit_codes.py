"""launch.exit_codes: which codes a launcher retries."""

from launch import exit_codes


def test_permanent_failures_are_not_retried_and_the_rest_are():
  assert not exit_codes.retried(exit_codes.OK)
  for code in (exit_codes.USAGE, exit_codes.DIVERGED, exit_codes.DISK_FULL):
    assert not exit_codes.retried(code)
  for code in (1, exit_codes.PEER_LOST, 128 + 9):
    assert exit_codes.retried(code)
