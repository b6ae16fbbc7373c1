"""Imported first by every benchmark (ruff's isort puts it before the third-party imports): the
process's threading environment is chosen before torch loads its OpenMP runtime, as the CLI does
(tokenbalance/threads.py)."""

from tokenbalance.threads import prepare_process

prepare_process()
