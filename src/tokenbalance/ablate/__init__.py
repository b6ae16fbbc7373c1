"""``tokenbalance ablate``: a grid of methods x seeds with a paper-layout table (docs/ablate.md).

* :mod:`.grid`: the rows (methods and their baselines), the grid presets, cells and the plan;
* :mod:`.cells`: each cell's run config, the per-seed start policy, what a restart does with a cell;
* :mod:`.runner`: runs the cells (child processes by default), resumably, into one directory;
* :mod:`.progress`: the grid's progress display and time-left estimate;
* :mod:`.results`, :mod:`.stats`, :mod:`.report`: the cells' numbers, CIs over seeds, the tables;
* :mod:`.curves`, :mod:`.figure1`: the reward curves and the Figure 1 panels on one batch;
* :mod:`.verl`: the same grid at paper scale on verl (its own subpackage): each row's launch, the
  scripts a cluster runs, their cost, and the table read back from the cells' verl logs.
"""
