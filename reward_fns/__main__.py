"""``python -m reward_fns``: print the reward registry (same table as ``grpo-plugin rewards``)."""

from reward_fns import format_registry

if __name__ == "__main__":
    print(format_registry())
