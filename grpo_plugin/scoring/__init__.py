"""The trainer's side of rewards (the verifiers themselves are `reward_fns`): the run's sources and
weights (`sources.py`), the one scorer every reward call goes through (`scorer.py`), where each
call runs (`calls.py`), what an answer must be (`answer_checks.py`), reward models, the extra
context a reward function receives, the in-process time limit, and a scored rollout's advantages
(`rollout_advantages.py`)."""
