"""A CPU harness for verl 0.9.x's own trainer, for the end-to-end tests (test tree only).

verl 0.9 has no CPU path through its trainer; this package supplies the missing pieces without
editing verl, through its public extension points where they exist:

* :mod:`.platform`: a ``cpu`` platform for verl's platform registry (device ``cpu``, backend
  gloo, Ray resource "GPU" as a logical stand-in);
* :mod:`.patches`: two runtime patches (a plain ``gloo`` process-group backend; FSDP2 CPU
  offload without pinned memory);
* :mod:`.rollout`: a small Hugging Face rollout backend (``hf_cpu``) behind verl's
  token-in/token-out server interface, with the naive weight sync from the actor;
* :mod:`.hook`: the module named in ``VERL_USE_EXTERNAL_MODULES``, which verl imports at
  ``import verl`` in every process (driver, Ray workers), and which installs all of the above;
* :mod:`.launch`: builds the tiny model, data and the command line, runs verl's trainer in a
  subprocess under a timeout and reads its metrics (the pytest side; imports no verl).

It leans on verl 0.9.1 internals (a private rollout registry, the server interface of
``RolloutReplica``); the ``verl==0.9.1`` pin guards it.
"""
