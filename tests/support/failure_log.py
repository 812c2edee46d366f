"""A pytest plugin for scripts/gpu_tests.sh (`-p support.failure_log --failure-log PATH`): each failure's traceback
appended to PATH as the test ends, so that a run its time limit cuts keeps why its finished tests failed (pytest
prints its failures only when the whole run ends). Under pytest-xdist the controller writes, from the reports its
workers send."""

from __future__ import annotations

import os


def pytest_addoption(parser):
    parser.addoption("--failure-log", default=None, metavar="PATH", help="append each failure here as it ends")


def pytest_configure(config):
    path = config.getoption("--failure-log")
    if path and not os.environ.get("PYTEST_XDIST_WORKER"):
        config.pluginmanager.register(FailureLog(path), "failure-log-writer")


class FailureLog:
    def __init__(self, path: str):
        self.path = path

    def pytest_runtest_logreport(self, report):
        if report.failed:
            with open(self.path, "a") as f:
                f.write(f"== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")
