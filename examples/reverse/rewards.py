"""The reward of the reverse-a-word example (docs/tasks.md): the share of the target's letters the
response has in the right place, 1.0 only for the exact answer."""


def reverse(response: str, target: str) -> float:
    got, want = response.split(), target.split()
    if got == want:
        return 1.0
    right = sum(a == b for a, b in zip(got, want))
    return 0.5 * right / len(want)  # partial credit, below a correct answer's 1.0
