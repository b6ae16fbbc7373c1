"""Sub-commands of the ``tokenbalance`` CLI, one module each (see :mod:`tokenbalance.cli`)."""

from tokenbalance.commands import ablate, build_model, diagnose, evaluate, gen_data, list_methods, plot, sft, train

COMMAND_MODULES = [train, sft, evaluate, gen_data, list_methods, diagnose, plot, ablate, build_model]
