"""``hf_cpu``: a small Hugging Face rollout backend behind verl's token-in/token-out interface.

verl 0.9.1 registers only vLLM, SGLang and TensorRT-LLM rollouts. This backend has the three
parts verl's colocated ("hybrid") trainer expects (registered by :mod:`.hook`):

* :class:`HFRolloutServer`, a Ray actor holding a CPU copy of the policy. Its
  ``generate(prompt_ids, sampling_params, request_id) -> TokenOutput`` samples with a KV cache
  (temperature, top-k, top-p; temperature <= 0 is greedy; stops at EOS or the length budget) and
  returns the sampled tokens' log-probs after temperature and filtering; ``update_weights`` loads
  the actor's weights; wake / sleep / abort / KV-cache calls are no-ops.
* :class:`HFRolloutReplica`, verl's ``RolloutReplica``. verl makes one replica per trainer rank
  (``rollout.tensor_model_parallel_size=1``); all replicas share one server (a named actor), so
  with several data-parallel ranks the samples do not depend on how verl's load balancer routes
  the requests.
* :class:`HFRolloutAdapter`, verl's ``BaseRollout`` built inside each actor worker; on the
  trainer's "naive" weight sync every rank receives the engine's per-tensor parameters (full
  tensors: the generator's ``full_tensor()`` calls are collectives) and rank 0 sends them.

Sampling is reproducible: each request draws from its own ``torch.Generator`` seeded from
(``rollout.seed``, weight version, prompt ids, how many times the server has seen this prompt at
this weight version), so two runs from the same weights and data draw the same samples for each
prompt, whatever the rank count; which of a prompt's concurrent requests gets which sample (and so
the order of the batch) follows their arrival order.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

ROLLOUT_NAME = "hf_cpu"  # registered by .hook
SERVER_NAME = f"{ROLLOUT_NAME}_server"  # the one server, shared by all replicas


def request_seed(*parts: Any) -> int:
    """A 63-bit seed from a stable hash of ``parts`` (``hash()`` is salted per process)."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def filter_logits(logits_V: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """``logits_V`` ([V], float) with tokens outside the top-k / nucleus set to -inf."""
    if top_k is not None and 0 < top_k < logits_V.shape[-1]:
        kth = torch.topk(logits_V, top_k).values[-1]
        logits_V = logits_V.masked_fill(logits_V < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_V, order_V = torch.sort(logits_V, descending=True)
        cumulative_V = torch.softmax(sorted_V, dim=-1).cumsum(dim=-1)
        drop_V = cumulative_V - torch.softmax(sorted_V, dim=-1) > top_p  # keep the token crossing top_p
        logits_V = logits_V.masked_fill(torch.zeros_like(drop_V).scatter(0, order_V, drop_V), float("-inf"))
    return logits_V


class HFRolloutServer:
    """One replica's generation server (a Ray actor; methods mirror verl's vLLM server)."""

    def __init__(self, config, model_config):
        from transformers import AutoModelForCausalLM

        self.config = config
        self.model = AutoModelForCausalLM.from_pretrained(model_config.path, dtype=torch.float32).eval()
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.model.config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
        self.global_steps: int | None = None
        self.seen: Counter = Counter()

    def ready(self) -> bool:
        return True

    def update_weights(self, state_dict: dict[str, torch.Tensor], global_steps: int | None = None) -> None:
        """Load the actor's weights (HF names; full tensors) and record the weight version."""
        missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        tied = set(getattr(self.model, "_tied_weights_keys", None) or [])
        if unexpected or set(missing) - tied:
            raise KeyError(f"hf_cpu weight sync: missing {sorted(set(missing) - tied)}, unexpected {unexpected}")
        self.set_global_steps(global_steps)

    def set_global_steps(self, global_steps: int | None) -> None:
        self.global_steps = global_steps
        self.seen.clear()

    @torch.inference_mode()
    def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str, **_: Any
    ) -> TokenOutput:
        """Sample one response to ``prompt_ids`` (token ids in, token ids and optional log-probs out)."""
        params = dict(sampling_params)
        prompt = [int(token) for token in prompt_ids]
        budget = self.config.prompt_length + self.config.response_length - len(prompt)
        max_tokens = params.pop("max_tokens", None) or params.pop("max_new_tokens", None)
        max_tokens = max(1, min(max_tokens or self.config.response_length, self.config.response_length, budget))
        temperature = float(params.get("temperature", 1.0))
        top_k = int(params.get("top_k", -1) or -1)
        top_p = float(params.get("top_p", 1.0))
        key = (self.global_steps, tuple(prompt))
        occurrence = self.seen[key]
        self.seen[key] += 1
        generator = torch.Generator().manual_seed(request_seed(self.config.seed, self.global_steps, prompt, occurrence))

        tokens: list[int] = []
        log_probs: list[float] = []
        output = self.model(input_ids=torch.tensor([prompt]), use_cache=True)
        for _step in range(max_tokens):
            logits_V = output.logits[0, -1].float()
            if temperature <= 0:
                token = int(torch.argmax(logits_V))
                logp_V = torch.log_softmax(logits_V, dim=-1)
            else:
                logits_V = filter_logits(logits_V / temperature, top_k, top_p)
                logp_V = torch.log_softmax(logits_V, dim=-1)
                token = int(torch.multinomial(logp_V.exp(), 1, generator=generator))
            tokens.append(token)
            log_probs.append(float(logp_V[token]))
            if token in self.eos_ids:
                break
            output = self.model(
                input_ids=torch.tensor([[token]]), past_key_values=output.past_key_values, use_cache=True
            )
        return TokenOutput(
            token_ids=tokens,
            log_probs=log_probs if params.get("logprobs") else None,
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps},
        )

    # verl's replica / checkpoint manager calls these around weight syncs and on shutdown
    def wake_up(self, tags=None) -> None:
        return None

    def sleep(self) -> None:
        return None

    def clear_kv_cache(self) -> None:
        return None

    def release_kv_cache(self) -> None:
        return None

    def resume_kv_cache(self) -> None:
        return None

    def abort_all_requests(self, reject_request: bool = False) -> dict:
        return {"aborted_count": 0, "request_ids": []}

    def resume_generation(self) -> None:
        return None

    def start_profile(self, **kwargs) -> None:
        return None

    def stop_profile(self) -> None:
        return None


class HFRolloutReplica(RolloutReplica):
    """verl's rollout replica; every replica uses the one :class:`HFRolloutServer` (``num_cpus=0``)."""

    async def launch_servers(self):
        if self.world_size != 1:
            raise ValueError(f"{ROLLOUT_NAME}: one process per replica; set rollout.tensor_model_parallel_size=1")
        server = (
            ray.remote(HFRolloutServer)
            .options(name=SERVER_NAME, get_if_exists=True, num_cpus=0, max_concurrency=1)
            .remote(self.config, self.model_config)
        )
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"{ROLLOUT_NAME}-replica-{self.replica_rank}"


class HFRolloutAdapter(BaseRollout):
    """The rollout object inside an actor worker: forwards weight syncs to the server (from rank 0)."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        self.is_sender = int(os.environ["RANK"]) == 0
        self.server = None

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    async def update_weights(self, weights, global_steps: int | None = None, **kwargs):
        """Gather ``weights`` (``(name, tensor)`` pairs, full tensors) and send them to the server.

        Every rank iterates the generator (its ``full_tensor()`` calls are collectives); rank 0 sends.
        """
        state_dict = {name: tensor.detach().to("cpu", torch.float32).clone() for name, tensor in weights}
        if not self.is_sender:
            return
        if self.server is None:
            self.server = ray.get_actor(SERVER_NAME)
        await self.server.update_weights.remote(state_dict, global_steps)
