"""The grid at paper scale on verl (``tokenbalance ablate --runner verl``, docs/scale.md).

* :mod:`.grid`: each row's launch and the cells; :mod:`.cost`: their estimated cost;
* :mod:`.scripts`, :mod:`.cell_script`: the scripts a cluster runs (one per cell, a one-node driver,
  a Slurm array);
* :mod:`.results`, :mod:`.report`: the cells read back from their verl logs, and the table.

Writing the scripts never imports verl.
"""
