"""Sub-commands of the ``tokenbalance`` CLI, one module each (see :mod:`tokenbalance.cli`)."""

from tokenbalance.commands import evaluate, gen_data, list_methods, sft, train

COMMAND_MODULES = [train, sft, evaluate, gen_data, list_methods]
