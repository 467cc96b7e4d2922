"""The tool of `tool_use.yaml`: what the model calls instead of multiplying in its head."""


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return int(a) * int(b)
