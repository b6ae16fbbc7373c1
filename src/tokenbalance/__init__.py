"""tokenbalance: RL with verifiable rewards for language models, built around token-level gradient balancing
(Advantage Reweighting, Lopti, TR-GRPO, NTHR) on GRPO and REINFORCE++.

The maths lives in :mod:`tokenbalance.algorithms` (pure tensor functions), the tasks in :mod:`tokenbalance.tasks`; the
command line is ``tokenbalance --help``."""

__version__ = "0.1.0"
