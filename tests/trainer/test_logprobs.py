"""Response log-probs: packing with left padding, temperature, hidden-state alignment."""

import torch

from tokenbalance.models import load_policy
from tokenbalance.trainer.logprobs import pack_sequences, response_logprobs


def test_pack_sequences_positions_follow_the_mask():
    packed = pack_sequences(
        torch.tensor([[0, 5, 6]]),
        torch.tensor([[False, True, True]]),
        torch.tensor([[7, 8, 0]]),
        torch.tensor([[True, True, False]]),
    )
    assert packed.input_ids_BL.tolist() == [[0, 5, 6, 7, 8, 0]]
    assert packed.attention_mask_BL.tolist() == [[0, 1, 1, 1, 1, 0]]
    assert packed.position_ids_BL.tolist() == [[0, 0, 1, 2, 3, 3]]
    assert packed.prompt_len == 3


def test_logprobs_match_a_plain_forward_and_ignore_left_padding(tiny_policy_dir):
    model, _ = load_policy(tiny_policy_dir)
    prompt, response, temperature = [11, 12, 13], [14, 15, 16, 1], 0.7
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0] / temperature
    expected = (
        torch.log_softmax(logits.float(), -1)[len(prompt) - 1 : -1]
        .gather(-1, torch.tensor(response)[:, None])
        .squeeze(-1)
    )
    padded = pack_sequences(
        torch.tensor([[0, 0] + prompt, [9, 10, 11, 12, 13]]),
        torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]).bool(),
        torch.tensor([response, response]),
        torch.ones(2, 4, dtype=torch.bool),
    )
    with torch.no_grad():
        out = response_logprobs(model, padded, temperature=temperature, with_hidden=True, with_entropy=True)
    torch.testing.assert_close(out.logp_BT[0], expected, atol=1e-5, rtol=0)
    assert not torch.allclose(out.logp_BT[1], expected, atol=1e-3)  # a different prompt does matter
    head = model.get_output_embeddings()
    from_hidden = torch.log_softmax(head(out.hidden_BTD[0]).float() / temperature, -1)
    torch.testing.assert_close(
        from_hidden.gather(-1, torch.tensor(response)[:, None]).squeeze(-1), expected, atol=1e-5, rtol=0
    )
    assert out.entropy_BT.shape == (2, 4) and bool((out.entropy_BT > 0).all())
