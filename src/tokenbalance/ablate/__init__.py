"""``tokenbalance ablate``: a grid of methods x seeds with a paper-layout table (docs/ablate.md): :mod:`.grid`,
:mod:`.cells`, :mod:`.runner`, :mod:`.progress`, :mod:`.results` / :mod:`.stats` / :mod:`.report` (numbers, CIs,
tables), :mod:`.curves` / :mod:`.figure1`, and :mod:`.verl` (the same grid at paper scale on verl)."""
