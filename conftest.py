"""Work units for pytest-xdist's ``--dist loadgroup`` (``make test`` and ``make check`` run two workers).

A test is a unit of its own, so the two workers share the suite test by test and finish together,
except two kinds of tests that must stay together; a unit runs whole, in collection order, on one
worker:

* the cells of one notebook (nbval): they share one kernel and each cell needs the ones before it;
* the tests of tests/test_book_render.py about one page: the session-scoped ``probe`` fixture opens
  each page in headless Chromium once per worker, so a page's checks go to one worker.

xdist's own loadgroup reads ``xdist_group`` marks through a suffix it writes into each item's node id,
which pytest 9.2 no longer lets it change (pytest-dev/pytest-xdist#1386: the marks are silently
ignored), so the units are told apart by their node ids here. This file sits at the repository root,
above tests/ and notebooks/, so that pytest loads it whichever of them it is given.
"""

import pytest


def _unit(nodeid: str) -> str | None:
    """The notebook or the rendered page a test belongs to, None for a test of its own."""
    path, _, name = nodeid.partition("::")
    if path.endswith(".ipynb"):
        return path
    if path.endswith("tests/test_book_render.py") and name.endswith("]"):
        return "page:" + name[name.index("[") + 1 : -1]
    return None


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, absent without it
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None  # xdist's own scheduler for any other --dist
    from xdist.scheduler import LoadGroupScheduling

    class NotebookAndPageScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid) or super()._split_scope(nodeid)

    return NotebookAndPageScheduling(config, log)
