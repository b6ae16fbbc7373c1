"""``tokenbalance ablate``: a grid of methods x seeds with a paper-layout table (docs/ablate.md).

:mod:`.grid` (rows, presets, cells, the plan), :mod:`.cells` (each cell's run config and start policy), :mod:`.runner`
(runs the cells, resumably), :mod:`.progress` (display, time left), :mod:`.results` / :mod:`.stats` / :mod:`.report`
(the cells' numbers, CIs over seeds, the tables), :mod:`.curves` / :mod:`.figure1` (reward curves, Figure 1 panels)
and :mod:`.verl` (the same grid at paper scale on verl: launches, cluster scripts, cost, the table from the cells'
verl logs)."""
