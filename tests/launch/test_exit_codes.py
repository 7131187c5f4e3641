"""launch.exit_codes: which codes are retried, the same rule as Kubeflow's ExitCode policy."""

from launch import exit_codes


def test_codes_from_128_are_retried_and_1_to_127_are_not():
  assert not exit_codes.retried(exit_codes.OK)
  for code in (1, exit_codes.USAGE, exit_codes.DIVERGED, exit_codes.DISK_FULL, 5, 127):
    assert not exit_codes.retried(code)
  for code in (128 + 9, 128 + 15, exit_codes.PEER_LOST, 255):
    assert exit_codes.retried(code)


def test_every_code_not_retried_says_why():
  assert exit_codes.why_not_retried(exit_codes.USAGE) == "a usage error is not retried"
  assert "1 to 127 are not retried" in exit_codes.why_not_retried(1)


def test_a_signal_reads_as_a_shell_reads_it():
  assert exit_codes.shell_code(-9) == 137 and exit_codes.shell_code(-15) == 143
  assert exit_codes.shell_code(3) == 3 and exit_codes.shell_code(0) == 0
