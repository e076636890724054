# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MM := $(VENV)/bin/mmloader
OUT ?= demo-out

.PHONY: demo test test-fast soak lint docs bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# Make raw image+caption data (and small video and audio clips), convert it (LMDB and tar shards),
# check it, plan and preview the video+audio+image experiment, train a tiny
# CLIP with DDP on 2 CPU processes, stop mid-epoch, and resume from the checkpoint.
demo: $(VENV)/.installed
	rm -rf $(OUT) && mkdir -p $(OUT)
	$(PY) samples/make_data.py $(OUT)/raw --count 2000 --corpus $(OUT)/corpus.txt \
		--clips $(OUT)/raw-clips --sounds $(OUT)/raw-sounds --media-count 24
	$(MM) convert pairs $(OUT)/raw $(OUT)/shapes.lmdb --workers 2 --require jpg,txt
	$(MM) convert pairs $(OUT)/raw $(OUT)/shapes --workers 2 --shard-size 250 --require jpg,txt
	$(MM) inspect $(OUT)/shapes.lmdb
	$(MM) verify $(OUT)/shapes --decode
	$(MM) preview $(OUT)/shapes -o $(OUT)/preview.png -n 8
	$(MM) plan samples/configs/mixed.yaml --world 2 --workers 1
	$(MM) convert pairs $(OUT)/raw-clips $(OUT)/clips.lmdb --require mp4,txt --check-decode --max-seconds 10
	$(MM) convert pairs $(OUT)/raw-sounds $(OUT)/sounds.lmdb --require flac,txt
	$(MM) inspect $(OUT)/clips.lmdb -n 1
	$(MM) plan samples/configs/av_mixed.yaml --world 2 --workers 1
	$(MM) preview samples/configs/av_mixed.yaml -o $(OUT)/preview-av.png -n 6
	$(VENV)/bin/torchrun --standalone --nproc_per_node 2 samples/train_clip_ddp.py \
		--data $(OUT)/shapes.lmdb --captions $(OUT)/shapes --epochs 3 --checkpoint $(OUT)/ckpt.pt --stop-after 40
	$(VENV)/bin/torchrun --standalone --nproc_per_node 2 samples/train_clip_ddp.py \
		--data $(OUT)/shapes.lmdb --captions $(OUT)/shapes --epochs 3 --checkpoint $(OUT)/ckpt.pt --resume

# img2dataset, which tests/storage/test_img2dataset.py runs as the command-line tool it is, lives in a venv
# of its own: it pins webdataset < 0.3 and pandas < 3, older than those the tests run with.
TOOLS ?= .venv-tools
$(TOOLS)/.installed:
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install -q 'img2dataset>=1.45'
	touch $@

# Whole test modules go to one pytest-xdist worker per core (at most 4): module fixtures (servers,
# a Ray cluster, a trained checkpoint) are made once, and the slowest modules start first.
XDIST ?= -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder
# The slowest tests are listed at the end: the suite's budget is 8 minutes on 2 cores.
test: $(VENV)/.installed $(TOOLS)/.installed
	MMLOADER_IMG2DATASET=$(abspath $(TOOLS))/bin/img2dataset $(PY) -m pytest -q $(XDIST) --durations=30

# The change loop: the unit tests (no process, no network; tests/kinds.py keeps them so), not the slow ones.
test-fast: $(VENV)/.installed
	MMLOADER_CONTRACT=fast $(PY) -m pytest -q $(XDIST) -m "unit and not slow"

# The contract's property test, deep: thousands of random plans and operation sequences per
# executor (tests/loading/test_contract.py), randomised, its failures kept in .hypothesis/.
soak: $(VENV)/.installed
	MMLOADER_CONTRACT=deep $(PY) -m pytest -q tests/loading/test_contract.py tests/frameworks/test_quorum_loader.py --hypothesis-show-statistics

# ruff (lint and format) and mypy, as configured in pyproject.toml
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# the documentation site, strict: a broken link, anchor or docstring reference fails it
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

bench: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) benchmarks/compare.py

clean:
	rm -rf $(OUT) bench-out site
