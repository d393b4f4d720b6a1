"""Pure checks: facts -> CheckResult. No I/O."""
