"""The grid at paper scale on verl (``tokenbalance ablate --runner verl``, docs/scale.md); writing it never imports verl.

* :mod:`.grid`: each row's launch and the cells; :mod:`.cost`: their estimated cost;
* :mod:`.scripts`, :mod:`.cell_script`: the scripts a cluster runs (per cell, one-node driver, Slurm array);
* :mod:`.plan`: the grid's own plan (``plan.json``) that ``--report-only`` reports;
* :mod:`.check_config`: verl's own ``validate_config`` on a list of overrides (imports verl when run);
* :mod:`.results`, :mod:`.report`: the cells read back from their verl logs, and the tables.
"""
