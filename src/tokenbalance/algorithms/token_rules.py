"""Your own token-level stage: a function of the per-token quantities, registered under a name.

A *token rule* is ``fn(inputs: TokenInputs) -> torch.Tensor``, registered with :func:`register_token_rule`: weights >=
0 that multiply the advantages (``output="weights"``) or a bool split into two optimizer passes (``output="split"``),
at ``stage="passes"`` (once per RL batch, old policy) or ``stage="loss"`` (per micro-batch, current policy). What each
stage sees, where it sits in the composition and the checks on what a rule returns: docs/methods.md §10."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tokenbalance.algorithms import _checks as check
from tokenbalance.algorithms._checks import masked_fill_invalid
from tokenbalance.algorithms.registry import Registry
from tokenbalance.user_code import first_line, shown

RULE_STAGES = ("passes", "loss")
RULE_OUTPUTS = ("weights", "split")
STAGE_OPTIONAL_INPUTS = {"passes": ("group_ids", "correct"), "loss": ("entropy",)}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class TokenInputs:
    """The per-token quantities a token rule reads ([B, T] unless noted; no gradient); outside ``response_mask_BT``
    they are neutral (log-prob 0, advantage 0, entropy 0) and what the rule returns there is ignored.

    Attributes:
        old_logp_BT: rollout-policy log-probs at the log-prob temperature.
        advantages_BT: the advantages the rule's weights multiply.
        response_mask_BT: bool, the valid tokens (loss stage: the pass's tokens and those its denominators count).
        logp_BT: current-policy log-probs, detached (loss stage only, else None).
        entropy_BT: current-policy next-token entropy (loss stage, where the runner computes it; else None).
        group_ids_B: [B] int64 group ids; correct_B: [B] bool correctness (passes stage, where the runner has them)."""

    old_logp_BT: torch.Tensor
    advantages_BT: torch.Tensor
    response_mask_BT: torch.Tensor
    logp_BT: torch.Tensor | None = None
    entropy_BT: torch.Tensor | None = None
    group_ids_B: torch.Tensor | None = None
    correct_B: torch.Tensor | None = None

    @property
    def old_prob_BT(self) -> torch.Tensor:
        return torch.exp(self.old_logp_BT)

    @property
    def prob_BT(self) -> torch.Tensor | None:
        return None if self.logp_BT is None else torch.exp(self.logp_BT)

    @property
    def position_BT(self) -> torch.Tensor:
        """[B, T] int64, the index of each token in its response (0 = the first response token)."""
        B, T = self.response_mask_BT.shape
        return torch.arange(T, device=self.response_mask_BT.device).expand(B, T)


def _source(function: Callable) -> tuple[str, str]:
    code = getattr(function, "__code__", None)
    return (getattr(code, "co_filename", ""), getattr(function, "__qualname__", repr(function)))


@dataclass(frozen=True)
class TokenRule:
    """A registered token rule; calling it applies the function with the checks.

    Attributes:
        name: its registered name (letters, digits, ``_ . -``), also the method's name.
        function: ``fn(inputs: TokenInputs) -> torch.Tensor``.
        stage: ``"passes"`` (old policy, once per batch) or ``"loss"`` (per micro-batch, current policy).
        output: ``"weights"`` (>= 0, multiply the advantages) or ``"split"`` (bool; ``passes`` only).
        needs: optional inputs read: ``entropy`` (loss stage), ``group_ids``, ``correct`` (passes stage).
        spec: ``MODULE:RULE`` / ``FILE.py:RULE`` that imports it in another process (verl's workers), when so loaded."""

    name: str
    function: Callable[[TokenInputs], torch.Tensor] = field(repr=False)
    stage: str
    output: str = "weights"
    needs: tuple[str, ...] = ()
    spec: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(f"token rule name: expected letters, digits, '_', '.', '-', got {shown(self.name)}")
        if not callable(self.function):
            raise ValueError(f"token rule {self.name!r}: expected a function, got {shown(self.function)}")
        check.choice(f"token rule {self.name!r}: stage", self.stage, RULE_STAGES)
        check.choice(f"token rule {self.name!r}: output", self.output, RULE_OUTPUTS)
        if self.output == "split" and self.stage != "passes":
            raise ValueError(
                f"token rule {self.name!r}: a split chooses the update passes, which are fixed before the "
                "loss runs; use stage='passes'"
            )
        offered = STAGE_OPTIONAL_INPUTS[self.stage]
        for need in self.needs:
            if need not in offered:
                raise ValueError(
                    f"token rule {self.name!r}: needs {need!r}, which stage {self.stage!r} does not offer; "
                    f"it offers {', '.join(map(repr, offered))} (docs/methods.md §10)"
                )

    @property
    def label(self) -> str:
        """How messages name it: ``'high_entropy' (rules.py:high_entropy)``, or its function's ``module.qualname``
        until it is loaded by a spec."""
        if self.spec is not None:
            return f"{self.name!r} ({self.spec})"
        module = getattr(self.function, "__module__", None)
        qualname = getattr(self.function, "__qualname__", type(self.function).__name__)
        return f"{self.name!r} ({module}.{qualname})" if module else f"{self.name!r} ({qualname})"

    @property
    def pass_names(self) -> tuple[str, str]:
        """A split's two passes, in execution order."""
        return (f"{self.name}_first", f"{self.name}_second")

    def inputs(
        self,
        old_logp_BT: torch.Tensor,
        advantages_BT: torch.Tensor,
        response_mask_BT: torch.Tensor,
        **optional: torch.Tensor | None,
    ) -> TokenInputs:
        """:class:`TokenInputs` with neutral padding; fails naming an input in ``needs`` that is None."""
        mask_BT = response_mask_BT.bool()
        for need in self.needs:
            key = {"entropy": "entropy_BT", "group_ids": "group_ids_B", "correct": "correct_B"}[need]
            if optional.get(key) is None:
                raise ValueError(
                    f"token rule {self.label} needs {key}, which this runner does not give its {self.stage!r} "
                    "stage (docs/methods.md §10 lists what each runner gives)"
                )

        def neutral(tensor_BT: torch.Tensor) -> torch.Tensor:
            return masked_fill_invalid(tensor_BT.detach(), mask_BT)

        def optional_neutral(key: str) -> torch.Tensor | None:
            tensor_BT = optional.get(key)
            return None if tensor_BT is None else neutral(tensor_BT)

        return TokenInputs(
            old_logp_BT=neutral(old_logp_BT),
            advantages_BT=neutral(advantages_BT),
            response_mask_BT=mask_BT,
            logp_BT=optional_neutral("logp_BT"),
            entropy_BT=optional_neutral("entropy_BT"),
            group_ids_B=optional.get("group_ids_B"),
            correct_B=optional.get("correct_B"),
        )

    def __call__(self, inputs: TokenInputs) -> torch.Tensor:
        """The function's output, checked: [B, T] weights (float, finite, >= 0; 1 at padding) or a [B, T] bool split
        (False at padding). No gradient."""
        mask_BT = inputs.response_mask_BT
        value = self.function(inputs)

        def bad(problem: str) -> ValueError:
            return ValueError(f"token rule {self.label} returned {problem}")

        if not isinstance(value, torch.Tensor):
            raise bad(f"{shown(value)}; expected a [B, T] torch.Tensor")
        if tuple(value.shape) != tuple(mask_BT.shape):
            raise bad(f"shape {tuple(value.shape)}; expected [B, T] = {tuple(mask_BT.shape)}")
        if value.device != mask_BT.device:
            raise bad(f"a tensor on {value.device}; the inputs are on {mask_BT.device}")
        value = value.detach()
        if self.output == "split":
            if value.dtype != torch.bool:
                raise bad(f"dtype {value.dtype}; a split is a bool tensor (True: the first pass)")
            return value & mask_BT
        if not value.is_floating_point():
            raise bad(f"dtype {value.dtype}; weights are floats (output='split' takes a bool mask)")
        valid = value[mask_BT]
        if valid.numel() and not bool(torch.isfinite(valid).all()):
            raise bad(f"{valid[~torch.isfinite(valid)][0].item()} at a valid token; weights must be finite")
        if valid.numel() and bool((valid < 0).any()):
            raise bad(
                f"{valid[valid < 0][0].item()} at a valid token; weights must be >= 0 (a negative weight would "
                "flip the advantage's sign and the side of the clip)"
            )
        return masked_fill_invalid(value.to(inputs.advantages_BT.dtype), mask_BT, 1.0)


def synthetic_inputs(rule: TokenRule) -> TokenInputs:
    """A small fixed batch (2 groups x 2 responses x 5 tokens, some padding, mixed advantages) with every input
    ``rule`` may read, the shapes and dtypes a runner gives: :func:`probe_rule`'s."""
    generator = torch.Generator().manual_seed(0)
    B, T = 4, 5
    mask_BT = torch.ones(B, T, dtype=torch.bool)
    mask_BT[1, 3:] = False
    mask_BT[3, 1:] = False
    old_logp_BT = -torch.rand(B, T, generator=generator, dtype=torch.float32) * 3
    advantages_BT = torch.tensor([1.0, -1.0, 0.5, -0.5]).unsqueeze(1).expand(B, T).clone()
    optional: dict[str, torch.Tensor | None] = {"logp_BT": old_logp_BT + 0.01} if rule.stage == "loss" else {}
    if rule.stage == "loss":
        optional["entropy_BT"] = torch.rand(B, T, generator=generator, dtype=torch.float32)
    else:
        optional |= {"group_ids_B": torch.tensor([0, 0, 1, 1]), "correct_B": torch.tensor([True, False, True, False])}
    return rule.inputs(old_logp_BT, advantages_BT, mask_BT, **optional)


def probe_rule(rule: TokenRule) -> None:
    """Run ``rule`` once on :func:`synthetic_inputs` with the runners' checks, so a broken rule fails before any model
    loads (one ``ValueError`` line naming the rule and its function)."""
    try:
        rule(synthetic_inputs(rule))
    except ValueError as err:
        if str(err).startswith(f"token rule {rule.label}"):
            raise ValueError(f"{err} (on a small synthetic batch, before the model loads)") from None
        raise ValueError(f"token rule {rule.label} raised {first_line(err)} on a small synthetic batch") from None
    except Exception as err:  # noqa: BLE001 - the user's function: reported in one line
        raise ValueError(f"token rule {rule.label} raised {first_line(err)} on a small synthetic batch") from None


def weight_metrics(weights_BT: torch.Tensor, mask_BT: torch.Tensor) -> dict[str, float]:
    """``token_rule/w_mean`` and ``token_rule/w_zero_frac`` over the valid tokens."""
    valid = weights_BT[mask_BT.bool()].double()
    if not valid.numel():
        return {"token_rule/w_mean": 0.0, "token_rule/w_zero_frac": 0.0}
    return {
        "token_rule/w_mean": float(valid.mean().item()),
        "token_rule/w_zero_frac": float((valid == 0).double().mean().item()),
    }


TOKEN_RULES: Registry[TokenRule] = Registry("token rule")


def register_token_rule(
    name: str,
    function: Callable[[TokenInputs], torch.Tensor] | None = None,
    *,
    stage: str,
    output: str = "weights",
    needs: tuple[str, ...] | list[str] = (),
):
    """Register ``function`` as the token rule ``name`` (without ``function``: a decorator returning the
    :class:`TokenRule`). Registering again replaces the rule if the function comes from the same place (a re-imported
    module, a re-run cell), else fails. The rule is then the method ``name``: ``grpo`` plus the rule.

        @register_token_rule("high_entropy", stage="loss", needs=("entropy",))
        def high_entropy(inputs: TokenInputs) -> torch.Tensor: ..."""

    def register(fn: Callable[[TokenInputs], torch.Tensor]) -> TokenRule:
        rule = TokenRule(name=name, function=fn, stage=stage, output=output, needs=tuple(needs))
        if name in TOKEN_RULES:
            current = TOKEN_RULES.get(name)
            if _source(current.function) != _source(fn):
                raise ValueError(f"token rule {name!r} is already registered by {current.label}; choose another name")
        return TOKEN_RULES.add(name, rule, replace=True)

    return register if function is None else register(function)


def rule_of(value: object, setting: str) -> TokenRule:
    """The registered rule that ``value`` is (a :class:`TokenRule`, or a function registered as one)."""
    if isinstance(value, TokenRule):
        return value
    for name in TOKEN_RULES:
        rule = TOKEN_RULES.get(name)
        if rule.function is value:
            return rule
    raise ValueError(
        f"{setting}: {getattr(value, '__qualname__', shown(value))} is not a registered token rule; decorate it "
        "with @register_token_rule(NAME, stage=...) (docs/methods.md §10)"
    )
