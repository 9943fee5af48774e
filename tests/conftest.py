import os

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
