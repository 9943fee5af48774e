import os
import sys

import pytest
import torch
from hypothesis import HealthCheck, settings

# Without a GPU the Triton kernels run in Triton's CPU interpreter, which must be switched on
# before any module holding @triton.jit functions is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

settings.register_profile(
    "default", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("ci", parent=settings.get_profile("default"), print_blob=True)
# The development loop, `make check`: a third of the examples (the slow tests are skipped too).
settings.register_profile("check", parent=settings.get_profile("default"), max_examples=20)
# A long local hunt: HYPOTHESIS_PROFILE=thorough make test
settings.register_profile("thorough", parent=settings.get_profile("default"), max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "default"))


@pytest.fixture(autouse=True)
def _end_a_worker_whose_cuda_context_died(request):
    """After each test that used CUDA, check that the CUDA context still works. A failed device-side
    assertion kills the process's context, and every later test in it would fail for that reason
    alone: end the process instead. Under pytest-xdist (``-n``, ``--max-worker-restart``) the
    worker's death fails this test and a fresh worker takes the rest; without xdist the session
    stops, naming the test."""
    yield
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return
    try:
        torch.cuda.synchronize()
    except RuntimeError as err:  # torch.AcceleratorError (a RuntimeError): the context is dead
        message = f"CUDA context dead after {request.node.nodeid}: {str(err).splitlines()[0]}"
        if os.environ.get("PYTEST_XDIST_WORKER"):
            print(message + "; ending this xdist worker", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(3)
        pytest.exit(message, returncode=3)
