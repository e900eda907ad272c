"""tests/server/checks.py - the PASS / FAIL lines and the tally that the server test scripts print
(test_smollm2, test_structured, test_tools, test_speculative)."""


class Checks:
    def __init__(self):
        self.passed = self.failed = 0

    def __call__(self, cond, what):
        """Prints PASS or FAIL what; counts it."""
        if cond:
            self.passed += 1
            print(f"PASS {what}")
        else:
            self.failed += 1
            print(f"FAIL {what}")

    def summary(self):
        """Prints the tally; the exit status: 0 when nothing failed."""
        print(f"{self.passed} passed, {self.failed} failed")
        return 0 if self.failed == 0 else 1
