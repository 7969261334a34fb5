# Two commands: `make run` (set up everything, serve on http://127.0.0.1:8000) and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
HOST   ?= 127.0.0.1
PORT   ?= 8000

.PHONY: run test lint format bench install migrate clean

# Re-install only when the dependency list changes.
$(VENV)/.installed: pyproject.toml
	@echo "==> Installing Python packages into $(VENV) (first run, or pyproject.toml changed: a minute or two)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# The page's JavaScript tooling (ESLint), from the lock file only; again when it changes.
node_modules/.installed: package-lock.json
	npm ci --no-audit --no-fund
	touch $@

install: $(VENV)/.installed node_modules/.installed

# First run only: a fresh SECRET_KEY in a git-ignored file; nothing secret lives in the repo.
.env.local: | $(VENV)/.installed
	@echo "==> Writing a fresh SECRET_KEY to .env.local (first run only)"
	$(PY) -c 'import secrets; print("SECRET_KEY=" + secrets.token_urlsafe(50))' > $@
	chmod 600 $@

migrate: $(VENV)/.installed .env.local
	@echo "==> Applying database migrations (SQLite db.sqlite3 unless DATABASE_URL is set)"
	$(PY) manage.py migrate --noinput

run: migrate
	@echo "==> Making sure a local login exists"
	$(PY) manage.py ensure_local_login --url http://$(HOST):$(PORT)/
	$(PY) manage.py sweep_streaming
	@echo "==> Serving http://$(HOST):$(PORT)/ (Ctrl+C stops; options: make run PORT=8001 HOST=127.0.0.1)"
	$(PY) -m cadau.serve -b $(HOST) -p $(PORT) cadau.asgi:application

test: install .env.local
	node --test tests/js/
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install .env.local
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .
	$(VENV)/bin/lint-imports
	npx eslint static/chat tests/js

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: install .env.local
	$(PY) -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) node_modules .pytest_cache .mypy_cache .ruff_cache db.sqlite3* test-db.sqlite3*
