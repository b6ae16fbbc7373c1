"""Our methods inside other RL runners, without forking them.

* :mod:`tokenbalance.integrations.verl`: policy losses, advantage estimators and the Lopti update
  schedule registered into verl (loaded through verl's ``verl.plugins`` entry point).
* :mod:`tokenbalance.integrations.trl`: a ``GRPOTrainer`` subclass with AR, TR-GRPO, Lopti and NTHR.

Each subpackage imports its host lazily and checks the installed version against the range our
tests cover (:func:`tokenbalance.integrations.versions.require_host`) before touching it.
"""
