"""Sub-commands of the ``tokenbalance`` CLI, one module each (see :mod:`tokenbalance.cli`)."""

from tokenbalance.commands import gen_data, list_methods

COMMAND_MODULES = [list_methods, gen_data]
