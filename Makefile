# Entry points (see README): `make book`, `make test` and, while developing, `make check`. Each sets
# up everything it needs.
PYTHON ?= python3
# pytest-xdist workers for `make test` and `make check`: one per core of the 2-core machines they are
# timed on (JOBS=0: the tests in the pytest process itself, as without xdist; more on a larger machine).
JOBS   ?= 2
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The oldest Triton the kernels support (rope.kernels.MIN_TRITON; the lent GPU machines and recent Colab
# runtimes have it): a second environment holding that Triton alone over .venv's packages, in which
# `make test` runs the kernel tests and chapters 18-19 in Triton's interpreter once more, those not
# marked slow (OLDEST_SELECT): its interpreter is slower, and with its fma computed by parts the slow
# ones take about 15 minutes of one core (`make test OLDEST_SELECT=` runs them all).
TRITON_OLDEST := 3.6.0
OLDEST_SELECT ?= -m "not slow"
OLDEST        := .venv-triton-$(TRITON_OLDEST)
OLDEST_STAMP  := $(OLDEST)/.installed
KERNEL_TESTS  := tests/test_triton_rotary.py tests/test_kernel_exactness.py tests/test_fused_attention.py \
                 tests/test_operators_hostile.py tests/test_emulation.py tests/test_attention_limits.py \
                 notebooks/18_kernels.ipynb notebooks/19_rope_inside_attention.ipynb

.PHONY: book test check env oldest-triton lock clean gpu-check gpu-wheels

env: $(STAMP)

# The virtual environment, from the pinned lock file; the project itself is installed editable.
$(STAMP): requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

# The second environment: its own site-packages (Triton $(TRITON_OLDEST)) come first, then .venv's, added
# by a .pth file (site.addsitedir, so .venv's own .pth files, the editable install of rope among
# them, are read too); a Jupyter kernel of its own for nbval.
oldest-triton: $(OLDEST_STAMP)

$(OLDEST_STAMP): $(STAMP) Makefile
	rm -rf $(OLDEST)
	$(PYTHON) -m venv $(OLDEST)
	$(PY) -c "import sysconfig; print(f'import site; site.addsitedir({sysconfig.get_paths()[\"purelib\"]!r})')" \
		> "$$($(OLDEST)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_venv_packages.pth"
	$(OLDEST)/bin/python -m pip install --quiet --no-deps triton==$(TRITON_OLDEST)
	$(OLDEST)/bin/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

# The rendered book in _build/html, from the notebooks' stored outputs, MathJax served locally; every
# page rebuilt (--all), so the References page lists what the chapters cite now.
book: $(STAMP)
	bash tools/fetch_mathjax.sh
	$(VENV)/bin/jupyter-book build --all --warningiserror --keep-going .

# The whole suite: unit and property tests, the rendered-book check, nbval on every notebook.
# One CPU thread per process (the xdist workers and the notebooks' kernels inherit it): torch's
# multithreaded float64 cos was seen to return values a few 1e-9 off on rare runs on a loaded 2-core
# machine, and the suite compares float64 results to 1e-12; every test is small, so threads buy
# nothing here. $(JOBS) worker processes share the tests one by one, except the groups of ./conftest.py
# (a notebook's cells, a rendered page's checks), each run whole on one worker; the 25 slowest
# tests are listed at the end.
test: book $(OLDEST_STAMP)
	bash tools/ensure_chromium.sh
	OMP_NUM_THREADS=1 $(PY) -m pytest --nbval -p no:cacheprovider -n $(JOBS) --dist loadgroup --durations=25
	OMP_NUM_THREADS=1 $(OLDEST)/bin/python -m pytest --nbval -p no:cacheprovider -n $(JOBS) --dist loadgroup \
		--durations=10 $(OLDEST_SELECT) $(KERNEL_TESTS)

# The development loop, 1 min 30 s on 2 idle cores: ruff, then the unit and property tests without
# the book (no build, no nbval, no tests/test_book_render.py), the tests marked slow skipped (every
# test file keeps fast tests here) and hypothesis at its `check` profile (HYPOTHESIS_PROFILE=default
# make check for the full number of examples), in $(JOBS) worker processes as `make test`.
check: $(STAMP)
	$(VENV)/bin/ruff check .
	OMP_NUM_THREADS=1 HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-check} $(PY) -m pytest tests -p no:cacheprovider \
		-n $(JOBS) --dist loadgroup -m "not slow" --ignore=tests/test_book_render.py -q

# Re-pin every package after changing pyproject.toml's pins. Local version labels are dropped
# (torch==2.13.0+cpu becomes torch==2.13.0): a pin with one installs only where that label's wheel
# index is configured, the plain version everywhere (the CPU wheel where one is at hand).
lock: $(STAMP)
	{ echo "# Every package of the test-and-book environment, pinned (pip freeze of .venv)."; \
	  echo "# Regenerate with: make lock"; \
	  $(PY) -m pip freeze --exclude-editable | sed -E 's/^([^=]+==[^+]+)\+.*$$/\1/'; } > requirements.lock

# Everything that needs a GPU, on the lent GPU machine, at most nine minutes (benchmarks/README.md,
# "make gpu-check"): that machine's own python3 (torch with CUDA, no network, so no virtual
# environment); results in $$OUT/gpu-check there, gpu-check-results/ elsewhere.
gpu-check:
	python3 benchmarks/gpu_check.py

# The wheels that machine lacks (nbval, ipykernel and their needs, the pinned hypothesis, Liger-Kernel)
# into .whl/, to carry there; needs a package registry.
gpu-wheels:
	bash tools/gpu_wheels.sh

clean:
	rm -rf _build _mathjax $(OLDEST)
