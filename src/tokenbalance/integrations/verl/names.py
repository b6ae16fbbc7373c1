"""The names we register into verl (:mod:`tokenbalance.integrations.verl_names`, which imports
without verl installed: the grid writer and the docs use them on machines without it)."""

from tokenbalance.integrations.verl_names import (  # noqa: F401
    ADVANTAGE_ESTIMATORS,
    LEGACY_FIELDS,
    LEGACY_POLICY_LOSSES,
    LOPTI_TRAINER,
    NTHR_HIDDEN_FIELD,
    NTHR_HIDDEN_KEY,
    NTHR_TRAINER,
    NTHR_UNSUPPORTED,
    POLICY_LOSS,
    POLICY_LOSS_CONFIG_TARGET,
    POLICY_LOSS_KEY,
    POLICY_LOSS_NAMES,
    STOP_FILE_ENV,
    SYNC_TRAINER,
    TOKEN_MEAN_SCOPE_KEY,
    TOKEN_MEAN_SCOPES,
    UPDATE_PASS_KEY,
    VERL_OWNED,
)
